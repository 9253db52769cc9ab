"""A maintenance timeline as inline SVG: one lane per event, a mark per thing that happened.

Shared by the fleet page and the demo's report, so both draw the same picture: when the
event was scheduled, its NotBefore, the decision, the approval, when it started and when
it was gone. Plain SVG with <title> tooltips: no script, no external asset, so it renders
under a strict Content-Security-Policy and in a saved file alike.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

# kind -> (shape, colour, legend text). Colours stay apart for common colour blindness.
MARKS: dict[str, tuple[str, str, str]] = {
    "scheduled": ("circle", "#1f77b4", "Scheduled (first seen)"),
    "decided": ("diamond", "#7a2c8f", "decision"),
    "approved": ("triangle", "#117733", "approved (StartRequests)"),
    "approval_failed": ("cross", "#b00020", "approval failed"),
    "not_before": ("bar", "#d55e00", "NotBefore"),
    "drain": ("diamond", "#8a6100", "drain"),
    "started": ("square", "#e69f00", "Started"),
    "removed": ("cross", "#555555", "removed / ended"),
}

LANE_HEIGHT = 40
# Marks that often coincide with another (a decision and a start within milliseconds of
# the first sighting) sit above or below the lane's line, so none hides another.
OFFSET = {"decided": -9.0, "drain": -9.0, "approved": 9.0, "approval_failed": 9.0}
LABEL_WIDTH = 230
PLOT_WIDTH = 760
TOP = 26


@dataclass(frozen=True)
class Mark:
    at: datetime
    kind: str  # a key of MARKS
    text: str = ""  # the tooltip, e.g. "decided HOLD by rule default-hold"


@dataclass(frozen=True)
class Lane:
    key: str  # the EventId
    label: str  # e.g. "Reboot web-1, web-2"
    marks: tuple[Mark, ...] = ()
    notes: tuple[str, ...] = field(default=())


def _x(at: datetime, start: datetime, span: float) -> float:
    """x of a moment; a moment past the axis's end sits at the end (drawn as off the chart)."""
    fraction = min((at - start).total_seconds() / span, 1.0)
    return LABEL_WIDTH + 10 + fraction * (PLOT_WIDTH - 90)


def _axis(lanes: Sequence[Lane], now: datetime | None) -> tuple[datetime, datetime]:
    """The axis: every mark, except a NotBefore far beyond everything else (a predicted
    failure's notice of days), which would squash the rest into one pixel."""
    moments = [m.at for lane in lanes for m in lane.marks] + ([now] if now else [])
    others = [m.at for lane in lanes for m in lane.marks if m.kind != "not_before"]
    others += [now] if now else []
    start = min(moments)
    if not others:
        return start, max(moments)
    core_end = max(others)
    limit = core_end + max(core_end - start, timedelta(seconds=30))
    return start, min(max(moments), limit)


def _shape(kind: str, x: float, y: float, title: str) -> str:
    shape, colour, legend = MARKS.get(kind, ("circle", "#333", kind))
    tip = f"<title>{html.escape(title or legend)}</title>"
    cls = f'class="mark mark-{html.escape(kind)}"'
    if shape == "circle":
        return f'<circle {cls} cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{colour}">{tip}</circle>'
    if shape == "square":
        return (
            f'<rect {cls} x="{x - 5:.1f}" y="{y - 5:.1f}" width="10" height="10" '
            f'fill="{colour}">{tip}</rect>'
        )
    if shape == "diamond":
        points = f"{x:.1f},{y - 7:.1f} {x + 7:.1f},{y:.1f} {x:.1f},{y + 7:.1f} {x - 7:.1f},{y:.1f}"
        return f'<polygon {cls} points="{points}" fill="{colour}">{tip}</polygon>'
    if shape == "triangle":
        points = f"{x:.1f},{y - 7:.1f} {x + 7:.1f},{y + 6:.1f} {x - 7:.1f},{y + 6:.1f}"
        return f'<polygon {cls} points="{points}" fill="{colour}">{tip}</polygon>'
    if shape == "bar":
        return (
            f'<rect {cls} x="{x - 1.5:.1f}" y="{y - 12:.1f}" width="3" height="24" '
            f'fill="{colour}">{tip}</rect>'
        )
    return (
        f'<path {cls} d="M{x - 5:.1f},{y - 5:.1f}L{x + 5:.1f},{y + 5:.1f}'
        f'M{x + 5:.1f},{y - 5:.1f}L{x - 5:.1f},{y + 5:.1f}" stroke="{colour}" '
        f'stroke-width="2.5">{tip}</path>'
    )


def render_svg(
    lanes: Sequence[Lane],
    *,
    now: datetime | None = None,
    tick_label: Callable[[datetime], str] = lambda t: t.strftime("%H:%M:%S"),
    title: str = "Maintenance timeline",
) -> str:
    """The whole chart; an empty list draws a one-line "nothing to show" figure."""
    esc = html.escape
    moments = [m.at for lane in lanes for m in lane.marks] + ([now] if now else [])
    if not lanes or not moments:
        return (
            f'<svg class="timeline" role="img" aria-label="{esc(title)}" width="400" '
            'height="30" xmlns="http://www.w3.org/2000/svg"><text x="4" y="20">'
            "No events to show.</text></svg>"
        )
    start, end = _axis(lanes, now)
    span = max((end - start).total_seconds(), 1.0)
    height = TOP + LANE_HEIGHT * len(lanes) + 48
    width = LABEL_WIDTH + PLOT_WIDTH
    parts = [
        f'<svg class="timeline" role="img" aria-label="{esc(title)}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" '
        'font-family="system-ui,sans-serif" font-size="12">',
        f"<title>{esc(title)}</title>",
    ]
    for tick in range(6):
        at = start + (end - start) * (tick / 5)
        x = _x(at, start, span)
        parts.append(
            f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{height - 40}" '
            'stroke="#e4e4e4"/>'
            f'<text x="{x:.1f}" y="{TOP - 10}" text-anchor="middle" fill="#555">'
            f"{esc(tick_label(at))}</text>"
        )
    if now is not None:
        x = _x(now, start, span)
        parts.append(
            f'<line class="now" x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{height - 40}" '
            'stroke="#888" stroke-dasharray="4 3"><title>now</title></line>'
        )
    for index, lane in enumerate(lanes):
        y = TOP + LANE_HEIGHT * index + LANE_HEIGHT / 2
        parts.append(f'<g class="lane" data-event="{esc(lane.key)}">')
        parts.append(
            f'<text x="4" y="{y + 4:.1f}">{esc(lane.label[:38])}'
            f"<title>{esc(lane.label)}</title></text>"
        )
        times = sorted(min(m.at, end) for m in lane.marks)
        if len(times) > 1:
            parts.append(
                f'<line x1="{_x(times[0], start, span):.1f}" y1="{y:.1f}" '
                f'x2="{_x(times[-1], start, span):.1f}" y2="{y:.1f}" stroke="#bbb" '
                'stroke-width="3"/>'
            )
        for mark in sorted(lane.marks, key=lambda m: m.kind == "not_before"):
            x = _x(mark.at, start, span)
            parts.append(_shape(mark.kind, x, y + OFFSET.get(mark.kind, 0.0), mark.text))
            if mark.at > end:  # off the chart: say when
                parts.append(
                    f'<text x="{x + 6:.1f}" y="{y + 4:.1f}" fill="#555">→ '
                    f"{esc(tick_label(mark.at))}<title>{esc(mark.text)} "
                    f"{esc(tick_label(mark.at))}</title></text>"
                )
        parts.append("</g>")
    legend_y = height - 16
    x = 4.0
    for kind, (_shape_name, _colour, legend) in MARKS.items():
        parts.append(_shape(kind, x + 6, legend_y - 4, legend))
        parts.append(f'<text x="{x + 16:.1f}" y="{legend_y:.1f}">{esc(legend)}</text>')
        x += 22 + 6.6 * len(legend)
    parts.append("</svg>")
    return "".join(parts)
