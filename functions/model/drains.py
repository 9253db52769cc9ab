"""Which drain a VM really has (issue 44 item 2, issue 45 "which drain").

A drain rule used to drain every VM through its relay's readiness probe when no drain step
of the operator's was configured, whether or not a load balancer probed that relay: on a VM
no load balancer probes, that drain was a wait that took nothing out of rotation, and the
cards and `policy explain` still said "its load balancer takes it out". `drain_for` is the
one answer, per VM, of which drain works there, in this order:

1. `hook`: the operator's relay hook (DRAIN__RELAY_HOOK), unless the relay reports (contract
   2) that it offers no hook;
2. `http`: the operator's HTTP drain (DRAIN__HTTP_URL), which speaks for every VM;
3. `readiness`: the relay's readiness probe, only where Azure's load-balancer probe
   (168.63.129.16) reached it within the last two probe intervals before its heartbeat
   (the heartbeat's `probe_at`, docs/contract.md §5), or where the relay offers a drain file
   the application or its proxy reads;
4. `none`: no working drain. The policy then holds a Platform event until NotBefore and
   approves a User event at once (functions.model.policy); the card, `policy explain` and
   the fleet page say "no drain on this VM".

Pure: the caller reads the VM's verified liveness hint (functions.store.liveness) and hands
its facts here, so the drain, the sweep's coverage counts and the page agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from functions.terminate.settings import DrainSettings

DrainKind = Literal["hook", "http", "readiness", "none"]
DRAIN_KINDS: tuple[DrainKind, ...] = ("hook", "http", "readiness", "none")
NO_DRAIN = "no drain on this VM"
NOTHING_CONFIGURED = (
    "no drain step configured (DRAIN__HTTP_URL, DRAIN__RELAY_HOOK; DRAIN__READINESS=false)"
)
# What a relay may offer (its heartbeat's `drain`, docs/contract.md §5).
OFFERS = frozenset({"hook", "readiness", "file"})


@dataclass(frozen=True)
class DrainChoice:
    """The drain a VM has, and why in words an operator reads."""

    kind: DrainKind
    why: str


@dataclass(frozen=True)
class RelayFacts:
    """What the app knows of a VM's relay from its verified heartbeat (LivenessHint).

    `heard`: the heartbeat's time; `contract`: the relay<->app contract it speaks (1 for
    relays before contract 2, which report neither probes nor drains); `probe_at`: when a
    load-balancer probe last reached its readiness endpoint (None: never since the relay
    started, or not reported); `drain`: the drain means it offers (None: not reported)."""

    heard: datetime | None = None
    contract: int = 1
    probe_at: datetime | None = None
    drain: tuple[str, ...] | None = None

    @classmethod
    def of(cls, hint: object | None) -> RelayFacts | None:
        """The facts of a LivenessHint (None: no hint believed). Fields a hint of an older
        app lacks read as contract 1."""
        if hint is None:
            return None
        contract = int(getattr(hint, "contract", 1) or 1)
        probe_at = getattr(hint, "probe_at", None)
        if isinstance(probe_at, int | float):
            probe_at = datetime.fromtimestamp(probe_at, UTC) if probe_at > 0 else None
        drain = getattr(hint, "drain", None)
        if isinstance(drain, str):
            drain = tuple(d for d in drain.split(",") if d)
        return cls(
            heard=getattr(hint, "seen", None),
            contract=contract,
            probe_at=probe_at if isinstance(probe_at, datetime) else None,
            drain=tuple(drain) if contract >= 2 and drain is not None else None,
        )

    def offers(self, means: str) -> bool | None:
        """Whether the relay offers this drain means; None when it does not say (contract 1)."""
        return None if self.drain is None else means in self.drain


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


def probed(facts: RelayFacts | None, settings: DrainSettings) -> bool:
    """Whether a load balancer probed this relay within the last two probe intervals before
    its heartbeat (DRAIN__PROBE_INTERVAL_SECONDS)."""
    if facts is None or facts.probe_at is None or facts.heard is None:
        return False
    age = (facts.heard - facts.probe_at).total_seconds()
    return age <= settings.probe_window_seconds()


def drain_for(facts: RelayFacts | None, settings: DrainSettings, now: datetime) -> DrainChoice:
    """The drain this VM really has (the module's order), and why."""
    # A relay that does not say what it offers (no heartbeat believed, or contract 1) is
    # asked for the hook, and one without it answers so (functions.terminate.plan.lacks_hook).
    if settings.relay_hook and (facts is None or facts.offers("hook") is not False):
        return DrainChoice("hook", f"relay hook {settings.relay_hook!r} (DRAIN__RELAY_HOOK)")
    if settings.http_url:
        return DrainChoice("http", "HTTP drain (DRAIN__HTTP_URL)")
    if not settings.readiness:
        return DrainChoice("none", f"{NO_DRAIN}: {NOTHING_CONFIGURED}")
    if facts is None:
        return DrainChoice("none", f"{NO_DRAIN}: no heartbeat of its relay is known")
    if facts.offers("readiness") is False and not facts.offers("file"):
        return DrainChoice("none", f"{NO_DRAIN}: its relay's readiness probe is off")
    if probed(facts, settings):
        assert facts.probe_at is not None and facts.heard is not None
        before = _ago((facts.heard - facts.probe_at).total_seconds())
        return DrainChoice(
            "readiness",
            f"readiness probe: a load balancer probed its relay {before} before its heartbeat "
            f"of {_ago((now - facts.heard).total_seconds())} ago",
        )
    if facts.offers("file"):
        return DrainChoice(
            "readiness", "its relay's drain file, which the application or its proxy reads"
        )
    if facts.contract < 2:
        return DrainChoice(
            "none",
            f"{NO_DRAIN}: its relay (contract {facts.contract}) does not report load-balancer "
            "probes, so its readiness drain is not known to work",
        )
    if facts.probe_at is None:
        return DrainChoice(
            "none", f"{NO_DRAIN}: no load balancer has probed its relay since it started"
        )
    last = _ago((now - facts.probe_at).total_seconds())
    return DrainChoice(
        "none",
        f"{NO_DRAIN}: no load balancer probed its relay in the "
        f"{settings.probe_window_seconds():g} s before its heartbeat (last probe {last} ago)",
    )


def count_kinds(choices: list[DrainChoice]) -> dict[str, int]:
    """How many VMs have each kind of drain (every kind listed, zeros included)."""
    out: dict[str, int] = dict.fromkeys(DRAIN_KINDS, 0)
    for choice in choices:
        out[choice.kind] += 1
    return out
