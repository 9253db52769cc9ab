"""`make demo SERVE=1`: the demo keeps its stack up and serves the operators' pages.

After the plan has played and the outcomes are printed, the relays, the simulator, Azurite
and the local host keep running, and local.pages_server serves the fleet page, each event's
page and the approval form on 127.0.0.1 as the demo's stand-in local operator. So that
there is something to approve, the demo raises one more event its policy holds: a
Platform Reboot of `HELD_VM` with a day of notice, which the demo policy's opt-in rule
hold-set-reboots holds to NotBefore (the default rules would drain it, then approve it at
once: issue 45) unless an operator approves it from its page (the approval then goes
through the VM's relay to IMDS, as in Azure). Ctrl-C stops everything, in order.
"""

from __future__ import annotations

import time

from functions.pipeline.coverage import run_coverage
from local.demo_state import DemoState as Demo
from local.pages_server import LocalPages

HELD_VM = "web-2"  # a VM with a relay whose Platform Reboot the demo policy holds
HELD_EVENT = "Reboot"  # local.plan's hold-set-reboots: Platform Reboots of web-* held
HELD_NOTICE = 24 * 3600.0  # simulated seconds: 24 minutes at the demo's 60x
HELD_DESCRIPTION = "Host maintenance (held by the policy: approve it from the event's page)"
SERVE_HINT = (
    "operators' pages: `make demo SERVE=1` (python -m local.demo --serve) keeps the stack up "
    "and serves the fleet, event and approval pages on 127.0.0.1 (local stand-in operator)"
)


def start_pages(demo: Demo) -> LocalPages:
    """The pages over the demo's own pipeline, stopped with the rest of the stack."""
    server = LocalPages(demo.host.pipeline).start()
    demo.stack.callback(server.stop)
    return server


def hold_one_for_approval(demo: Demo, timeout: float = 30.0) -> str | None:
    """Raise the held Reboot and wait until the bridge has decided it: its EventId once
    held, None if it was not decided in time or the policy in effect (POLICY__* settings
    replace the demo's) does not hold it, as it would then go on its own."""
    from simulator.scenarios import EventSpec

    spec = EventSpec(
        event_type=HELD_EVENT,
        source="Platform",
        resources=[HELD_VM],
        notice=HELD_NOTICE,
        description=HELD_DESCRIPTION,
    )
    [event_id] = demo.sim.apply(spec)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = demo.store.get_event(event_id)
        if record is not None and record.decision is not None:
            return event_id if record.decision.action == "hold" else None
        time.sleep(0.2)
    return None


def page_lines(server: LocalPages, seen: list[str], held: str | None) -> list[str]:
    """What the demo prints: where each page is, said to be local."""
    lines = [
        "Operators' pages, LOCAL (the demo's stand-in operator, no Entra ID sign-in), "
        "until Ctrl-C:",
        f"  fleet:    {server.fleet_url}",
    ]
    if seen:
        lines.append(f"  an event: {server.event_url(seen[-1])}")
    if held:
        lines.append(
            f"  approve:  {server.event_url(held)} (a {HELD_EVENT} of {HELD_VM} the policy holds "
            "until NotBefore: approve it there)"
        )
    else:
        lines.append(
            f"  approve:  (no {HELD_EVENT} of {HELD_VM} held: not decided in time, or the "
            "policy in effect does not hold it)"
        )
    return lines


def serve(demo: Demo, seen: list[str], wait: float | None = None) -> list[str]:
    """Start the pages, raise the held event, print where they are, and block until
    Ctrl-C (KeyboardInterrupt), or `wait` seconds for tests."""
    server = start_pages(demo)
    held = hold_one_for_approval(demo)
    # The fleet page's Coverage is the identity sync's pass (every 10 minutes in Azure):
    # one now, so the page shows the relays the demo ran, not the fleet as it started.
    run_coverage(demo.host.pipeline, force=True, drain=demo.drain_settings)
    lines = page_lines(server, seen, held)
    print()
    for line in lines:
        print(line, flush=True)
    if wait is None:
        while True:
            time.sleep(3600)
    time.sleep(wait)
    return lines
