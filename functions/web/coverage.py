"""The fleet page's coverage section (issue 44 item 4): VMs in scope with no relay heard,
relays silent, relay versions and contracts, and the drain each VM really has, from the
coverage summary row (functions.pipeline.coverage: one point read a page view)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from functions.notify import describe
from functions.web import render

esc = render.esc

DRAIN_WORDS = {
    "hook": "your relay hook (DRAIN__RELAY_HOOK)",
    "http": "your HTTP drain (DRAIN__HTTP_URL)",
    "readiness": "readiness probe (a load balancer probes its relay)",
    "none": "no drain on this VM: held (Platform) / approved at once (User)",
}


def _named(count: int, names: list[str]) -> str:
    if not names:
        return ""
    more = f" … and {count - len(names)} more" if count > len(names) else ""
    return "<br><small>" + esc(", ".join(names) + more) + "</small>"


def coverage_section(state: dict[str, Any] | None, now: datetime) -> str:
    """The section's HTML; a note that no pass ran yet when `state` is None."""
    if state is None:
        return (
            "<h2>Coverage</h2><p class=muted>No coverage pass yet (it runs on the identity "
            "sync's timer, every 10 minutes at most).</p>"
        )
    at = datetime.fromisoformat(state["generated_at"])
    warn = state["no_relay"] or state["silent"] or state["not_accepted"]
    rows = [
        ["VMs in scope (identity sync)", str(state["in_scope"])],
        [
            "no relay heard",
            f"<span class={'warn' if state['no_relay'] else 'ok'}>{state['no_relay']}</span>"
            + _named(state["no_relay"], state["no_relay_vms"]),
        ],
        ["relays enrolled", str(state["enrolled"])],
        ["with a heartbeat row", str(state["heartbeat_rows"])],
        [
            "relays silent",
            f"<span class={'warn' if state['silent'] else 'ok'}>{state['silent']}</span>"
            + _named(state["silent"], state["silent_vms"]),
        ],
        [
            "relay versions",
            esc(", ".join(f"{v}: {n}" for v, n in state["versions"].items()) or "none"),
        ],
        [
            "relay contracts (this app accepts "
            + esc(", ".join(str(c) for c in state["accepted_contracts"]))
            + ")",
            esc(", ".join(f"{c}: {n}" for c, n in state["contracts"].items()) or "none"),
        ],
        [
            "on a contract this app does not accept",
            f"<span class={'warn' if state['not_accepted'] else 'ok'}>"
            f"{state['not_accepted']}</span>"
            + _named(state["not_accepted"], state["not_accepted_vms"]),
        ],
    ]
    if state.get("drain_error"):
        rows.append(["drain in effect", f"<span class=warn>{esc(state['drain_error'])}</span>"])
    for kind, count in state["drains"].items():
        extra = _named(count, state["no_drain_vms"]) if kind == "none" else ""
        cls = "warn" if kind == "none" and count else ""
        label = f"<span class={cls}>{count}</span>" if cls else str(count)
        rows.append([esc(f"drain: {DRAIN_WORDS.get(kind, kind)}"), label + extra])
    head = "<h2>Coverage</h2>" + (
        '<p class="warn">Some VMs are not covered: see below.</p>' if warn else ""
    )
    return (
        head + f"<p class=muted>As of {esc(describe.relative(at, now))} "
        f"({esc(at.strftime('%H:%M:%S UTC'))}); unbelieved liveness rows: "
        f"{state['unbelieved_rows']}.</p>" + render.table(["", "VMs"], rows, cls="coverage")
    )
