"""The HTML report's section on the backtest of the demo's own history (local/demo_backtest.py).

Apart from the run, so the report (which every part imports for `Outcome`) imports nothing
that imports it back.
"""

from __future__ import annotations

import html
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from functions.backtest.replay import Backtest


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
