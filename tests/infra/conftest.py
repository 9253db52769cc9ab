"""Lines the infra tests print at the end of a run that included them (the offline schema
check's coverage); tests/conftest.py prints them, from every xdist worker."""

from __future__ import annotations

SUMMARIES: list[str] = []
