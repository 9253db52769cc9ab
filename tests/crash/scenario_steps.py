"""The words the crash scenarios are written in (tests/crash/approval_scenarios.py,
tests/crash/effect_scenarios.py): a VM's message observed at a time, time passing with the
watchdog's timer ticking, the policy rules they use, and the sweeps that end each one.

Kept apart from the scenarios so both themes share one vocabulary, and from
tests/crash/scenarios.py, which lists them (it imports both themes, which import this).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from functions.model.policy import Match, Rule
from tests.crash.runner import WATCHDOG_PERIOD_SECONDS, Step, advance, deliver, drain, watchdog
from tests.crash.world import Servers
from tests.functions.conftest import T0, envelope

# The end of every scenario: a sweep after the approval claims' staleness (budget + 60 s)
# has passed, and one after every lease (drain steps lease at most until their deadline)
# and NotBefore: whatever was left due must be done, or announced overdue, by then.
FINAL = (120.0, 1200.0)


def at_seconds(seconds: float) -> Any:
    """The FakeClock's time `seconds` after T0."""
    return T0 + timedelta(seconds=seconds)


def doc(
    vm: str,
    seq: int,
    events: list[dict[str, Any]],
    servers: Servers,
    at: float,
    **where: Any,
) -> Step:
    """VM `vm`'s relay sends its `seq`-th message, observed `at` seconds after T0."""
    body = envelope(
        vm, seq, events, callback_url=servers.relay.url, observed_at=at_seconds(at), **where
    )
    return deliver(body, f"{vm}#{seq}")


def until(now: float, at: float) -> list[Step]:
    """Time passes from `now` to `at` (seconds after T0) with the watchdog's timer ticking
    every minute, as in Azure; whatever a tick announces is drained."""
    steps: list[Step] = []
    while now + WATCHDOG_PERIOD_SECONDS <= at:
        steps += [advance(WATCHDOG_PERIOD_SECONDS), watchdog(), drain()]
        now += WATCHDOG_PERIOD_SECONDS
    if at > now:
        steps.append(advance(at - now))
    return steps


def approve_rule(*types: str) -> Rule:
    return Rule(
        name="approve-" + "-".join(types).lower(), match=Match(event_types=types), action="approve"
    )


def drain_rule(*types: str) -> Rule:
    return Rule(
        name="drain-" + "-".join(types).lower(), match=Match(event_types=types), action="drain"
    )
