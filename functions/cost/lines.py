"""One priced line of the monthly estimate (shared by the model and the template's resources)."""

from __future__ import annotations

from pydantic import BaseModel


class Line(BaseModel):
    part: str  # Functions, Service Bus, Table storage, Log Analytics, Network, ...
    item: str
    quantity: float
    unit: str
    usd: float
