"""The demo's readable timeline, its summary of expected outcomes, and the same as HTML.

A newcomer watching `make demo` should be able to follow each maintenance event from the
moment IMDS shows it to the moment someone was told and the VM was let go, without reading
logs. The HTML report is the same story kept for later (and attached by CI), so both are
built from one list of entries.
"""

from __future__ import annotations

import html
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from functions.web.timeline import Lane, render_svg
from local.report_backtest import backtest_section

# What each kind of line is about; the label is what the terminal shows.
KINDS: dict[str, str] = {
    "demo": "demo",  # the demo itself: starting, stopping, a part missing
    "imds": "IMDS",  # the simulator's documents changed
    "relay": "relay",  # a relay forwarded or approved something
    "decide": "policy",  # a decision and the rule behind it
    "notify": "told",  # a message reached Teams / PagerDuty / a webhook
    "drain": "drain",  # the terminate workflow
    "approve": "approve",  # the simulator saw StartRequests
    "check": "check",  # an expected outcome, met or not
}
_COLOURS = {
    "demo": "1",
    "imds": "36",
    "relay": "34",
    "decide": "35",
    "notify": "32",
    "drain": "33",
    "approve": "1;32",
    "check": "1",
}


@dataclass(frozen=True)
class Entry:
    seconds: float  # since the demo started
    at: datetime
    kind: str
    subject: str  # a VM, an EventId (short), a channel
    text: str
    ok: bool | None = None  # for checks: met or not


@dataclass(frozen=True)
class Outcome:
    """One thing the demo promised, and whether it happened."""

    name: str
    ok: bool
    detail: str = ""
    skipped: bool = False  # could not be checked here (e.g. the channel posts to a real URL)


@dataclass
class Timeline:
    """Thread-safe: receivers, watchers and the host all add to it from their own threads."""

    stream: TextIO | None = field(default_factory=lambda: sys.stdout)
    colour: bool | None = None
    started: float = field(default_factory=time.monotonic)
    entries: list[Entry] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        if self.colour is None:
            self.colour = wants_colour(self.stream)

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def add(self, kind: str, subject: str, text: str, ok: bool | None = None) -> Entry:
        entry = Entry(
            seconds=time.monotonic() - self.started,
            at=datetime.now(UTC),
            kind=kind,
            subject=subject,
            text=text,
            ok=ok,
        )
        with self._lock:
            self.entries.append(entry)
            if self.stream is not None:
                try:
                    self.stream.write(self.format(entry) + "\n")
                    self.stream.flush()
                except (OSError, ValueError):
                    # `make demo | head` closed the pipe: keep recording, stop printing, and
                    # never let a print stop the demo from cleaning up after itself.
                    self.stream = None
        return entry

    def format(self, entry: Entry) -> str:
        label = KINDS.get(entry.kind, entry.kind)
        mark = "" if entry.ok is None else ("✔ " if entry.ok else "✘ ")
        line = f"{entry.seconds:6.1f}s  {label:<7}  {entry.subject:<18} {mark}{entry.text}"
        if self.colour:
            colour = _COLOURS.get(entry.kind, "0")
            if entry.ok is False:
                colour = "1;31"
            line = f"\033[{colour}m{line}\033[0m"
        return line

    def snapshot(self) -> list[Entry]:
        with self._lock:
            return list(self.entries)


@dataclass(frozen=True)
class EventRow:
    event_id: str
    what: str
    vms: str
    story: str
    decision: str  # "hold by rule default-hold: reason"
    approval: str  # "StartRequests from web-1, 14.2 s before NotBefore" / "none needed"
    channels: str  # "teams x2, webhook x5, PagerDuty trigger"
    final_state: str = ""  # "completed", "cancelled: Azure withdrew it before it started"
    drain: str = ""  # "started 10:01:02, done 10:01:09 (6.8 s)"; "" when not drained


@dataclass(frozen=True)
class Payload:
    channel: str
    subject: str  # the short EventId, or the VM
    summary: str  # the transition, or PagerDuty's action
    at: datetime
    status: int
    body: str  # pretty JSON


@dataclass
class ReportData:
    lanes: list[Lane] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    policy_source: str = ""
    policy: str = ""  # pretty JSON of the effective policy, or the error
    payloads: list[Payload] = field(default_factory=list)
    # Announcements handed to a channel's worker (one per announcement and channel), and
    # how many of them the channel posted (it does not send every transition).
    deliveries: int = 0
    posted: int = 0
    # Deliveries a channel failed: (channel, the event's short id or the subject,
    # transition, the error), shown first in the report.
    failed: list[tuple[str, str, str, str]] = field(default_factory=list)
    backtest: Any = None  # functions.backtest.replay.Backtest (local/demo_backtest.py)
    # Each Freeze's impact ledger: (lane label, rows of functions.ledger.table_rows).
    ledgers: list[tuple[str, list[list[str]]]] = field(default_factory=list)


def payload_counts(data: ReportData) -> str:
    """Why the payloads are fewer than the deliveries the checklist counts: each
    announcement is handed to every channel (a delivery), a channel posts only what it
    sends (PagerDuty pages on some transitions only), and the drain hook's requests and
    a channel's retries are payloads without a delivery of their own."""
    hooks = sum(1 for p in data.payloads if p.channel == "drain")
    return (
        f"{len(data.payloads) - hooks} channel posts and {hooks} drain hook requests; "
        f"{data.deliveries} deliveries (each announcement handed to each channel), "
        f"{data.posted} of them posted, {data.deliveries - data.posted} not sent by their "
        "channel (a transition it does not post, or the channel off); a retried post "
        "counts once as a delivery and once per try as a payload"
    )


def short_id(event_id: str) -> str:
    """The first block of a GUID: enough to tell events apart on a terminal line."""
    return event_id.split("-")[0][:8] if event_id else "?"


def unmet_first(outcomes: list[Outcome]) -> list[Outcome]:
    """Outcomes not met first (what a reader must see), then met, then not checked; each
    group in the demo's order."""
    return sorted(outcomes, key=lambda o: 2 if o.skipped else (1 if o.ok else 0))


RED, GREEN, BOLD_RED = "31", "32", "1;31"
TOLD_FAILED = ' class="told-failed"'  # an event's "told" cell naming a failed channel


def paint(text: str, colour: str, on: bool) -> str:
    """`text` in an ANSI colour when `on` (a terminal that wants colour), else as it is."""
    return f"\033[{colour}m{text}\033[0m" if on else text


def summary_lines(outcomes: list[Outcome], colour: bool = False) -> list[str]:
    """The checklist for the terminal, outcomes not met first, and its headline last (red
    with anything not met, green otherwise, when `colour`)."""
    lines = []
    for outcome in unmet_first(outcomes):
        mark = "skip" if outcome.skipped else ("ok  " if outcome.ok else "FAIL")
        detail = f" — {outcome.detail}" if outcome.detail else ""
        line = f"  [{mark}] {outcome.name}{detail}"
        lines.append(paint(line, RED, colour and not outcome.ok and not outcome.skipped))
    failed = [o for o in outcomes if not o.ok and not o.skipped]
    skipped = [o for o in outcomes if o.skipped]
    met = len(outcomes) - len(failed) - len(skipped)
    text = f"  {met}/{len(outcomes) - len(skipped)} expected outcomes met"
    if skipped:
        text += f", {len(skipped)} not checked"
    if failed:
        text += f"; {len(failed)} NOT met"
    lines.append(paint(text, BOLD_RED if failed else GREEN, colour))
    return lines


def wants_colour(stream: TextIO) -> bool:
    """Colour on a terminal, unless NO_COLOR is set (no-color.org)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty() and not os.environ.get("NO_COLOR"))


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem;color:#1b1b1b}
h1{font-size:1.4rem} h2{font-size:1.1rem;margin-top:2rem}
table{border-collapse:collapse;width:100%} td,th{padding:.25rem .6rem;text-align:left;
vertical-align:top;border-bottom:1px solid #eee} th{background:#f6f6f6}
.k-imds{color:#00707a}.k-relay{color:#1f4fa8}.k-decide{color:#7a2c8f}.k-notify{color:#1b7a2c}
.k-drain{color:#8a6100}.k-approve{color:#116622;font-weight:600}.k-demo{color:#444}
.ok{color:#116622;font-weight:600}.fail{color:#b00020;font-weight:600}.skip{color:#777}
code{font:12px ui-monospace,Consolas,monospace}
pre{font:12px ui-monospace,Consolas,monospace;background:#f7f7f7;padding:.5rem;overflow:auto;
max-height:30rem} details{margin:.2rem 0} summary{cursor:pointer}
svg.timeline{max-width:100%;height:auto} td.final{font-weight:600}
p.headline{font-size:1.1rem} section.attention{border-left:4px solid #b00020;
padding:.2rem 1rem;background:#fff4f5} td.told-failed{color:#b00020;font-weight:600}
"""


def render_html(
    title: str,
    entries: list[Entry],
    outcomes: list[Outcome],
    facts: dict[str, str] | None = None,
    data: ReportData | None = None,
) -> str:
    """A single self-contained page (no scripts, no external assets). Events first: a
    timeline chart (a lane per event) and one row per event (how it ended, who or which rule
    decided, the drain, the approval, who was told); then the checklist of expected
    outcomes, the policy in effect, every payload the receivers got (click to open) and
    the log."""
    esc = html.escape
    data = data or ReportData()
    rows = []
    for e in entries:
        mark = "" if e.ok is None else ("✔ " if e.ok else "✘ ")
        cls = "" if e.ok is None else (' class="ok"' if e.ok else ' class="fail"')
        rows.append(
            f'<tr class="k-{esc(e.kind)}"><td>{e.seconds:.1f}s</td>'
            f"<td>{esc(e.at.strftime('%H:%M:%S'))}</td><td>{esc(KINDS.get(e.kind, e.kind))}</td>"
            f"<td><code>{esc(e.subject)}</code></td><td{cls}>{esc(mark + e.text)}</td></tr>"
        )
    results = []
    for o in unmet_first(outcomes):
        cls, word = (
            ("skip", "skipped") if o.skipped else (("ok", "met") if o.ok else ("fail", "NOT met"))
        )
        results.append(
            f'<tr><td class="{cls}">{word}</td><td>{esc(o.name)}</td><td>{esc(o.detail)}</td></tr>'
        )
    fact_rows = "".join(
        f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in (facts or {}).items()
    )
    event_rows = "".join(
        f'<tr class="event"><td><code>{esc(short_id(r.event_id))}</code></td>'
        f"<td>{esc(r.what)}</td><td>{esc(r.vms)}</td>"
        f'<td class="final">{esc(r.final_state)}</td><td>{esc(r.decision)}</td>'
        f"<td>{esc(r.drain or '—')}</td><td>{esc(r.approval)}</td>"
        f"<td{TOLD_FAILED if r.channels.startswith('FAILED') else ''}>"
        f"{esc(r.channels or 'none')}</td><td>{esc(r.story)}</td></tr>"
        for r in data.events
    )
    payloads = "".join(
        f'<details class="payload payload-{esc(p.channel)}"><summary>'
        f"{esc(p.at.strftime('%H:%M:%S'))} {esc(p.channel)} <code>{esc(p.subject)}</code> "
        f"{esc(p.summary)} → {p.status}</summary><pre>{esc(p.body)}</pre></details>"
        for p in data.payloads
    )
    summary = summary_lines(outcomes)[-1].strip()
    unmet = [o for o in outcomes if not o.ok and not o.skipped]
    headline = f'<p class="{"fail" if unmet else "ok"} headline">{esc(summary)}.</p>'
    policy = (
        f"<h2>Policy in effect</h2><p>{esc(data.policy_source)}</p>"
        f"<details><summary>the effective policy</summary><pre>{esc(data.policy)}</pre>"
        "</details>"
        if data.policy
        else ""
    )
    chart = (
        "<h2>What happened to each event</h2>"
        + render_svg(data.lanes, title="Each event from IMDS to removal")
        + '<table class="events"><tr><th>event</th><th>what</th><th>VMs</th>'
        "<th>how it ended</th><th>decided (rule)</th><th>drain</th>"
        "<th>approval (lead before NotBefore)</th><th>told</th>"
        f"<th>scenario</th></tr>{event_rows}</table>"
        if data.lanes
        else ""
    )
    sent = (
        f"<h2>Payloads sent ({len(data.payloads)})</h2>"
        "<p>What Teams, Slack, PagerDuty, the webhook and the drain hook received, in order: "
        f"{esc(payload_counts(data))}.</p>"
        f"{payloads}"
        if data.payloads
        else ""
    )
    return (
        "<!doctype html><html lang=en><meta charset=utf-8>"
        f"<title>{esc(title)}</title><style>{_CSS}</style><body>"
        f"<h1>{esc(title)}</h1>{headline}"
        f"{attention_html(unmet, data.failed)}"
        f"<p>Generated {esc(datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%S UTC'))}.</p>"
        f"<table>{fact_rows}</table>"
        f"{chart}"
        f"{backtest_section(data.backtest)}{ledger_html(data)}"
        "<h2>Expected outcomes</h2>"
        f'<table class="outcomes"><tr><th>result</th><th>outcome</th><th>detail</th></tr>'
        f"{''.join(results)}</table>"
        f"{policy}{sent}"
        "<h2>Timeline</h2>"
        "<table><tr><th>t</th><th>UTC</th><th>what</th><th>subject</th><th>detail</th></tr>"
        f"{''.join(rows)}</table></body></html>\n"
    )


def attention_html(unmet: list[Outcome], failed: list[tuple[str, str, str, str]]) -> str:
    """What went wrong, before anything else: the outcomes not met and the deliveries a
    channel failed ("" when there are none)."""
    if not unmet and not failed:
        return ""
    esc = html.escape
    items = [
        f'<li class="fail">NOT met: {esc(o.name)}{esc(f" — {o.detail}" if o.detail else "")}</li>'
        for o in unmet
    ]
    items += [
        f'<li class="fail">{esc(channel)} FAILED {esc(transition)} of <code>{esc(subject)}'
        f"</code>: {esc(error)}</li>"
        for channel, subject, transition, error in failed
    ]
    return f'<section class="attention"><h2>Needs attention</h2><ul>{"".join(items)}</ul></section>'


def ledger_html(data: ReportData) -> str:
    """The impact ledger of the demo's Freezes: advertised beside what the relays measured."""
    from functions.ledger import TABLE_HEADER

    if not data.ledgers:
        return ""
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in TABLE_HEADER)
    parts = [
        "<h2>Impact ledger of the Freezes</h2><p>Per VM: what Azure advertised beside what its "
        "relay measured (the simulator paused each guest for the Freeze's duration). Export "
        "one for a support case with <code>python -m functions ledger EVENT_ID --csv</code>."
        "</p>"
    ]
    for label, rows in data.ledgers:
        body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
        parts.append(f'<h3>{esc(label)}</h3><table class="ledger"><tr>{head}</tr>{body}</table>')
    return "".join(parts)


# The environment's channel settings: a Teams, Slack or webhook URL is itself the secret
# (its path and query carry the signature), like a routing key or a webhook secret.
SECRET_SETTINGS = (
    "TEAMS_WEBHOOK_URL",
    "SLACK_WEBHOOK_URL",
    "WEBHOOK_URL",
    "WEBHOOK_SECRET",
    "PAGERDUTY_ROUTING_KEY",
)


def without_secrets(page: str, env: Mapping[str, str] | None = None) -> str:
    """`page` with every secret channel setting of `env` (and each of its URL's secret
    parts, functions.notify.reasons.redact) taken out: the report is a file people share,
    and a demo run against a real Slack or Teams puts its URL in failure texts."""
    from functions.notify.reasons import redact

    env = os.environ if env is None else env
    for name in SECRET_SETTINGS:
        value = (env.get(name) or "").strip()
        if value:
            page = redact(page, value)
    return page


def write_html(path: Path, *args: object, **kwargs: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    page = render_html(*args, **kwargs)  # type: ignore[arg-type]
    path.write_text(without_secrets(page), encoding="utf-8")
    return path
