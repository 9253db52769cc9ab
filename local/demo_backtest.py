"""The demo's backtest of its own history (its report section: local/report_backtest.py).

At the end of the run (before anything is stopped) the demo's events table, in Azurite, is
replayed through the policy in effect with the same code as `python -m functions policy
backtest` (functions.backtest). Replaying a history through the policy that made it must
give back every decision: a difference is a bug in the backtest (or the app), so it is an
expected outcome of the demo like the others. The printed table and the report show what
an operator would see for a candidate of their own.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from local.report import Outcome

if TYPE_CHECKING:
    from local.demo_state import DemoState

EVERYTHING = datetime(1970, 1, 1, tzinfo=UTC)
LABEL = "the backtest of the demo's own history gives back each decision"


def run_backtest(demo: DemoState) -> list[Outcome]:
    """Replay, print the table, keep the result on `demo.backtest` for the report."""
    from functions.backtest.cli import backtest_store
    from functions.backtest.render import render_text

    store = getattr(demo, "store", None)
    settings = getattr(demo, "settings", None)
    if store is None or settings is None or settings.policy.policy is None:
        return [Outcome(LABEL, False, "no events table or no valid policy", skipped=True)]
    now = datetime.now(UTC)
    result = backtest_store(
        store,
        settings.policy.policy,
        EVERYTHING,  # the run's own Azurite holds this run alone
        now,
        policy_source=demo.policy_source,
        drain_configured=True,  # the demo's drain worker runs the relay hook and HTTP drain
    )
    demo.backtest = result
    compared = [r for r in result.events if r.changed is not None]
    demo.timeline.add(
        "decide",
        "backtest",
        f"replayed {len(result.events)} event(s) of the events table through the policy in "
        "effect (python -m functions policy backtest):",
    )
    stream = demo.timeline.stream
    if stream is not None:
        try:
            stream.write(render_text(result) + "\n\n")
            stream.flush()
        except (OSError, ValueError):
            demo.timeline.stream = None
    differ = [r.past.event_id[:8] for r in result.changed]
    peak = max((p.peak for p in result.peaks), default=0)
    detail = (
        f"{len(compared)} decision(s) replayed, {len(differ)} differ"
        + (f" ({', '.join(differ)})" if differ else "")
        + f"; {len(result.holds)} hold(s) to NotBefore; worst set peak {peak}"
    )
    if not compared:  # a plan with no decided event (`--plan` of your own, the bench)
        return [Outcome(LABEL, True, f"no decided event to replay; {detail}", skipped=True)]
    ok = not differ and not [s for s in result.skipped if s.error]
    return [Outcome(LABEL, ok, detail)]


def report_backtest(demo: Any) -> Any:
    """What the report keeps of it (None when the demo did not get that far)."""
    return getattr(demo, "backtest", None)
