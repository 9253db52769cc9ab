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
