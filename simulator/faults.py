"""Injected misbehaviour: what IMDS does on a bad day, on demand.

A relay must survive every one of these without losing a document or approving blindly, so
tests need to produce them exactly when they want and as often as they want.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FaultKind = Literal[
    "status", "slow", "drop", "malformed", "first-call-delay", "short-nonce", "other-nonce"
]
# Faults on the attested document's nonce (FaultBook.take_nonce_fault), not on the request.
NONCE_KINDS = ("short-nonce", "other-nonce")
Endpoint = Literal["scheduledevents", "startrequests", "compute", "token", "attested", "any"]


class Fault(BaseModel):
    """A misbehaviour to inject. `vm` None: every VM. `count` None: until cleared.

    `endpoint` picks the IMDS path it affects: scheduledevents by default, so a relay's
    token or compute calls do not silently use up a fault meant for its polling;
    "startrequests" only the POSTs of StartRequests to it (an IMDS refusing an approval
    while its document still reads).
    """

    model_config = ConfigDict(extra="forbid")

    id: int = 0
    kind: FaultKind
    vm: str | None = None
    count: int | None = Field(default=1, ge=1)
    status: int = Field(default=500, ge=400, le=599)
    seconds: float = Field(default=1.0, ge=0, le=600)
    endpoint: Endpoint = "scheduledevents"
    used: int = 0

    @property
    def exhausted(self) -> bool:
        return self.count is not None and self.used >= self.count

    def matches(self, vm: str, endpoint: str, post: bool = False) -> bool:
        starts = "startrequests" if post and endpoint == "scheduledevents" else ""
        wanted = ("any", endpoint, starts)
        return not self.exhausted and (self.vm is None or self.vm == vm) and self.endpoint in wanted


@dataclass
class FaultAction:
    """What the server must do to one request: wait, then maybe misbehave instead of answering."""

    delay: float = 0.0
    kind: Literal["status", "drop", "malformed"] | None = None
    status: int = 500


class FaultBook:
    """The active faults. Not locked: the Simulator calls it under its own lock."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._last_id = 0

    def add(self, fault: Fault) -> int:
        self._last_id += 1
        fault.id = self._last_id
        self._faults.append(fault)
        return fault.id

    def clear(self, vm: str | None = None) -> int:
        before = len(self._faults)
        self._faults = [f for f in self._faults if vm is not None and f.vm != vm]
        return before - len(self._faults)

    def active(self) -> list[Fault]:
        return [f.model_copy() for f in self._faults if not f.exhausted]

    def take(self, vm: str, endpoint: str, post: bool = False) -> FaultAction:
        """Use up the faults matching one request: every slow one adds its delay, the first
        status/drop/malformed one decides the answer."""
        action = FaultAction()
        for fault in self._faults:
            if fault.kind in (*NONCE_KINDS, "first-call-delay"):
                continue
            if not fault.matches(vm, endpoint, post):
                continue
            fault.used += 1
            if fault.kind == "slow":
                action.delay += fault.seconds
                continue
            action.kind = fault.kind
            action.status = fault.status
            break
        self._prune()
        return action

    def take_first_call(self, vm: str) -> float | None:
        """The enablement delay for a VM's first scheduledevents request, if one is injected."""
        for fault in self._faults:
            if fault.kind == "first-call-delay" and fault.matches(vm, "scheduledevents"):
                fault.used += 1
                self._prune()
                return fault.seconds
        return None

    def take_nonce_fault(self, vm: str, nonce: str) -> str | None:
        """How an attested request misbehaves, if a nonce fault is injected (Microsoft's page
        documents a 10-digit nonce; the REST spec allows 32): "short-nonce", a 400 to a
        nonce over 10 characters; "other-nonce", a 200 whose signed nonce is IMDS's own
        instead of the one asked (any nonce)."""
        for fault in self._faults:
            if fault.kind not in NONCE_KINDS or not fault.matches(vm, "attested"):
                continue
            if fault.kind == "short-nonce" and len(nonce) <= 10:
                continue
            fault.used += 1
            self._prune()
            return fault.kind
        return None

    def _prune(self) -> None:
        self._faults = [f for f in self._faults if not f.exhausted]


@dataclass
class Enablement:
    """Whether Scheduled Events is enabled for a VM; the first request enables it, slowly
    if a first-call-delay is injected, and calls arriving meanwhile wait for the same end."""

    enabled: bool = False
    until: float | None = None  # time.monotonic() at which enabling ends

    def reset(self) -> None:
        self.enabled, self.until = False, None

    def begin(self, delay: float | None) -> float:
        """The first request arrived: enable, taking `delay` seconds if one is injected."""
        self.enabled = True
        if delay:
            self.until = time.monotonic() + delay
            return delay
        return 0.0

    def remaining(self) -> float:
        return max(0.0, self.until - time.monotonic()) if self.until is not None else 0.0
