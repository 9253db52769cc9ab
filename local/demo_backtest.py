"""The demo's backtest of its own history, and its section of the HTML report.

At the end of the run (before anything is stopped) the demo's events table, in Azurite, is
replayed through the policy in effect with the same code as `python -m functions policy
backtest` (functions.backtest). Replaying a history through the policy that made it must
give back every decision: a difference is a bug in the backtest (or the app), so it is an
expected outcome of the demo like the others. The printed table and the report show what
an operator would see for a candidate of their own.
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from local.report import Outcome

if TYPE_CHECKING:
    from functions.backtest.replay import Backtest
    from local.orchestration import Demo

EVERYTHING = datetime(1970, 1, 1, tzinfo=UTC)
LABEL = "the backtest of the demo's own history gives back each decision"


def run_backtest(demo: Demo) -> list[Outcome]:
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
    demo.backtest = result  # type: ignore[attr-defined]
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


def backtest_section(result: Backtest | None) -> str:
    """The report's section: the same three tables as the command's text."""
    if result is None:
        return ""
    from functions.backtest.render import candidate, mark, vms, what

    esc = html.escape

    def when(moment: datetime | None) -> str:
        return moment.strftime("%H:%M:%S") if moment else "—"

    rows = "".join(
        f"<tr><td><code>{esc(r.past.event_id[:8])}</code></td><td>{esc(what(r))}</td>"
        f"<td>{esc(vms(r))}</td><td>{when(r.decided_at)}</td>"
        f"<td>{when(r.past.event.not_before)}</td><td>{esc(candidate(r))}</td>"
        f"<td>{esc(mark(r))}</td><td>{esc(r.past.actual)}</td></tr>"
        for r in result.events
    )
    peaks = "".join(
        f"<tr><td>{esc(p.kind)} {esc(p.name)}</td><td>{p.peak}</td><td>{when(p.at)}</td>"
        f"<td>{esc(', '.join(i[:8] for i in p.event_ids))}</td>"
        f"<td>{'over by ' + str(p.over) if p.over else 'within'}</td></tr>"
        for p in result.peaks
    )
    holds = "".join(
        f"<tr><td><code>{esc(h.event_id[:8])}</code></td><td>{esc(h.event_type)}</td>"
        f"<td>{when(h.held_from)}</td><td>{when(h.not_before)}</td>"
        f"<td>{h.seconds:.0f} s</td><td>{esc(h.why)}</td></tr>"
        for h in result.holds
    )
    compared = [r for r in result.events if r.changed is not None]
    return (
        '<h2 id="backtest">Backtest of this run\'s history</h2>'
        f"<p>The events table replayed through {esc(result.policy_source)} "
        "(<code>python -m functions policy backtest</code>): "
        f"{len(compared) - len(result.changed)} of {len(compared)} decisions the same (=), "
        f"{len(result.changed)} different (≠). Try your own candidate on a real history "
        "with <code>--policy FILE</code>.</p>"
        '<table class="backtest"><tr><th>event</th><th>what</th><th>VMs</th>'
        "<th>decided at</th><th>NotBefore</th><th>candidate</th><th></th><th>actual</th></tr>"
        f"{rows}</table>"
        f"<h3>Worst concurrent impact per set (max_concurrent_per_set {result.limit})</h3>"
        '<table class="backtest-sets"><tr><th>set</th><th>peak</th><th>at</th>'
        f"<th>events</th><th>limit</th></tr>{peaks}</table>"
        f"<h3>Holds that would run to NotBefore ({len(result.holds)})</h3>"
        '<table class="backtest-holds"><tr><th>event</th><th>type</th><th>held from</th>'
        f"<th>NotBefore</th><th>wait</th><th>why</th></tr>{holds}</table>"
    )


def report_backtest(demo: Any) -> Any:
    """What the report keeps of it (None when the demo did not get that far)."""
    return getattr(demo, "backtest", None)
