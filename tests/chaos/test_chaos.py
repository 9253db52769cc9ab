"""The chaos suite's short version (issue 40): a few runs of the demo's whole stack under a
fault, each identical to the fault-free run of its plan. The full suite is
`python -m tests.chaos` and `make bench` (chaos_runs, chaos_divergent).

Also the suite's own parts, quickly: the refusing proxy, the comparison and the table.
"""

from __future__ import annotations

import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from tests.chaos.proxy import RefusingProxy
from tests.chaos.runner import Result, compare, quick_runs, run_all, summary, table


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.xdist_group("chaos")
def test_the_short_chaos_suite_ends_as_its_fault_free_runs():
    results = run_all(quick_runs())
    assert summary(results) == {
        "chaos_runs": len(quick_runs()),
        "chaos_divergent": 0,
        "chaos_faults_not_fired": 0,  # every fault did something to the stack
    }, table(results)


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args: object) -> None:
        pass


def test_the_proxy_forwards_refuses_and_forwards_again():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = RefusingProxy(server.server_address[1]).start()
    url = f"http://127.0.0.1:{proxy.port}/"
    try:
        assert urllib.request.urlopen(url, timeout=5).read() == b"hello"
        proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        proxy.accept()
        assert urllib.request.urlopen(url, timeout=5).read() == b"hello"  # the same port
    finally:
        proxy.stop()
        server.shutdown()
        server.server_close()


def test_a_difference_is_named_and_an_allowed_one_set_apart():
    baseline = {
        "live-migration web-1": {"ended": "completed", "announced": ["completed", "started"]},
        "preempt spot-1": {"ended": "completed", "drain_script": 1},
    }
    faulty = {
        "live-migration web-1": {"ended": "", "announced": ["started"]},
        "preempt spot-1": {"ended": "completed", "drain_script": 0},
    }
    differences, excused = compare(baseline, faulty, {"preempt spot-1": "outlasts its notice"})
    assert differences == [
        "live-migration web-1: announced ['started'], fault-free ['completed', 'started']",
        "live-migration web-1: ended '', fault-free 'completed'",
    ]
    assert excused == ["preempt spot-1: drain_script 0, fault-free 1"]
    assert compare(baseline, baseline) == ([], [])
    result = Result(
        "storage x", "wave", "f", "did it", 1.0, faulty, 2, differences, excused, trace="x"
    )
    text = table([result])
    assert "DIVERGENT" in text and "ended ''" in text and "(allowed)" in text
    assert summary([result]) == {"chaos_runs": 1, "chaos_divergent": 1, "chaos_faults_not_fired": 0}


# Issue 47: on 2f59d6a a fault that never fired came out "identical" (a fault aimed at a
# VM outside the plan), a baseline that never ended its events was compared with as it
# stood, and `chaos_runs` was the length of the list, runs that never played included.


def test_a_run_whose_fault_left_no_trace_is_divergent():
    same = {"live-migration web-1": {"ended": "completed"}}
    quiet = Result("clock of a VM outside the plan", "freeze", "f", "", 1.0, same, 0)
    assert quiet.differences == [] and quiet.unfired and quiet.divergent
    assert "NOT FIRED" in table([quiet])
    never = Result("a shard that died", "", "f", "", 0.0, {}, 0, error="no output")
    assert summary([quiet, never]) == {
        "chaos_runs": 1,  # the run that played, not the two asked for
        "chaos_divergent": 2,
        "chaos_faults_not_fired": 1,
    }


def test_a_baseline_that_did_not_end_its_events_makes_its_runs_divergent(monkeypatch):
    from tests.chaos import runner

    stuck = {"live-migration web-1": {"ended": ""}}

    def play(plan, fault, time_scale, settle_limit):
        baseline = fault.name == "none"
        return Result(
            "",
            plan.name,
            fault.name,
            "",
            1.0,
            stuck,
            0,
            trace="" if baseline else "x",
            settled=not baseline,
        )

    monkeypatch.setattr(runner, "play", play)
    (result,) = run_all(quick_runs()[:1])
    assert result.divergent and "did not end every event" in result.error, result


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.xdist_group("chaos")
def test_a_fault_that_never_fires_makes_the_suite_fail():
    """The negative control on the whole stack: a relay killed mid-drain, aimed at a plan
    with no drain (the freeze plan's web-1 runs no hook), kills nothing."""
    from tests.chaos import faults
    from tests.chaos.runner import Run

    run = Run(
        "relay of web-1 killed mid-drain",
        "freeze",
        lambda: faults.RelayKilledMidDrain("web-1"),
        {},
        60,
        60,
    )
    (result,) = run_all((run,))
    assert result.executed and result.unfired and result.divergent, table([result])
    assert summary([result])["chaos_faults_not_fired"] == 1


# Issue 47: in `make bench` on 3c1894f both 90 s storage outages of the wave came out
# DIVERGENT on the drained Reboot: approved False, no StartRequests, no `approved`
# announced or posted. The outage (3 s to 93 s) outlasts the Reboot's notice (NotBefore
# about 45 s) and its approval, due at about 2.9 s, needs Table storage: when the outage
# comes first Azure starts it unapproved at NotBefore (docs/chaos.md). Only that, and a
# `started` whose report and end both fell in the outage, is excused; nothing else on it.

REBOOT_FAULT_FREE: dict[str, Any] = {
    "ended": "completed",
    "announced": [
        "approved",
        "completed",
        "decided",
        "drain_started",
        "scheduled",
        "started",
        "undrained",
    ],
    "approved": True,
    "start_requests": 1,
    "drain_hook": ["drain", "undrain"],
    "posted": {
        "slack": ["approved", "completed", "decided", "drain_started", "started", "undrained"],
        "webhook": [
            "scheduled",
            "decided",
            "drain_started",
            "approved",
            "started",
            "completed",
            "undrained",
        ],
    },
}


def _without(seen: dict[str, Any], *transitions: str, **fields: object) -> dict[str, Any]:
    out = {**seen, **fields}
    out["announced"] = [t for t in seen["announced"] if t not in transitions]
    out["posted"] = {
        c: [t for t in posts if t not in transitions] for c, posts in seen["posted"].items()
    }
    return out


@pytest.mark.parametrize("name", ["storage frozen 90 s", "storage refusing 90 s"])
def test_a_reboot_the_long_outage_left_unapproved_is_allowed_and_nothing_else(name):
    from tests.chaos.runner import RUNS

    (run,) = [r for r in RUNS if r.name == name]
    key = "platform-reboot app-1"
    baseline = {key: REBOOT_FAULT_FREE}

    def verdict(seen: dict[str, Any]) -> tuple[list[str], list[str]]:
        return compare(baseline, {key: seen}, run.allowed)

    # As the bench saw it: the outage came before the approval.
    unapproved = _without(REBOOT_FAULT_FREE, "approved", approved=False, start_requests=0)
    differences, excused = verdict(unapproved)
    assert differences == [] and len(excused) == 4, (differences, excused)
    # Approved before the outage, its Started report and its end both in it.
    assert verdict(_without(REBOOT_FAULT_FREE, "started"))[0] == []
    assert verdict(_without(REBOOT_FAULT_FREE, "approved", "started", approved=False))[0] == []
    # Anything else on the Reboot still counts.
    assert verdict(_without(REBOOT_FAULT_FREE, "drain_started"))[0]
    assert verdict({**unapproved, "drain_hook": ["undrain"]})[0] == [
        f"{key}: drain_hook ['undrain'], fault-free ['drain', 'undrain']"
    ]
    assert verdict({**unapproved, "ended": "cancelled"})[0]
    assert verdict({**REBOOT_FAULT_FREE, "start_requests": 2})[0]
    extra = {**REBOOT_FAULT_FREE, "announced": [*REBOOT_FAULT_FREE["announced"], "overdue"]}
    assert verdict(extra)[0]
    slack = REBOOT_FAULT_FREE["posted"]["slack"]
    reordered = {**REBOOT_FAULT_FREE["posted"], "webhook": slack}
    assert verdict({**REBOOT_FAULT_FREE, "posted": reordered})[0]


class _Clock:
    """The runner's clock, advanced only by its own sleeps: settle's waits, no real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _KeptWorker:
    """Teams' `decided`, kept through the outage, sent by the worker's pass at `sent_at`."""

    def __init__(self, clock: _Clock, sent_at: float) -> None:
        self.clock, self.sent_at = clock, sent_at

    def sent(self) -> bool:
        return self.clock.now >= self.sent_at

    def unsent(self) -> int:
        return 0 if self.sent() else 1


class _Channel:
    def __init__(self, busy_until: float, clock: _Clock) -> None:
        self.busy_until, self.clock = busy_until, clock

    def idle(self) -> bool:
        return self.clock.now >= self.busy_until


def test_settle_waits_for_a_kept_post_sent_late_not_for_a_quiet_time(monkeypatch):
    """Issue 46: 'channels down past their deliveries' read Teams without its `decided` when
    the kept worker's pass (every 6 s at 20x, later on a busy machine) came more than QUIET
    after the last post; the post was not lost, only read too early. Settle now waits for
    every post to be done with: kept ones sent, none in a subscription's deliveries."""
    from tests.chaos import runner

    clock = _Clock()
    worker = _KeptWorker(clock, sent_at=runner.QUIET * 3)  # the pass after QUIET
    demo = SimpleNamespace(kept=worker, subscriptions=[_Channel(runner.QUIET * 2, clock)])
    monkeypatch.setattr(runner, "time", clock)

    def signature(demo: Any, plan: Any) -> dict[str, dict[str, Any]]:
        teams = ["approved", "completed", "started"] + (["decided"] if worker.sent() else [])
        return {"live-migration web-1": {"ended": "completed", "posted": {"teams": teams}}}

    monkeypatch.setattr(runner, "signature", signature)
    got, settled = runner.settle(demo, runner.PLANS["freeze"], limit=60)
    assert settled
    assert "decided" in got["live-migration web-1"]["posted"]["teams"], got
    assert clock.now >= runner.QUIET * 3 + runner.QUIET  # quiet counted from the late post


def test_settle_gives_up_at_its_limit_while_a_post_is_still_kept(monkeypatch):
    """A channel that never comes back: not settled (its post still kept), at the limit."""
    from tests.chaos import runner

    clock = _Clock()
    demo = SimpleNamespace(kept=_KeptWorker(clock, sent_at=10**6), subscriptions=[])
    monkeypatch.setattr(runner, "time", clock)
    monkeypatch.setattr(
        runner, "signature", lambda demo, plan: {"live-migration web-1": {"ended": "completed"}}
    )
    _, settled = runner.settle(demo, runner.PLANS["freeze"], limit=30)
    assert not settled and 30 <= clock.now <= 31


def test_a_subscription_is_idle_only_once_done_with_each_message():
    """What settle asks of each channel's subscription: busy from `put` until `on_done` has
    seen the message (here a delivery held open), idle after."""
    from local.subscription import Subscription

    release, done = threading.Event(), threading.Event()
    subscription = Subscription(
        "teams", lambda note: release.wait(), on_done=lambda *_: done.set()
    ).start()
    assert subscription.idle()
    subscription.put("a post")
    assert not subscription.idle()  # queued or in its delivery
    release.set()
    subscription.stop()  # after the message: joined once it is done with
    assert done.is_set() and subscription.idle()
