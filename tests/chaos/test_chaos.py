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
    assert summary(results) == {"chaos_runs": len(quick_runs()), "chaos_divergent": 0}, table(
        results
    )
    assert all(r.note for r in results), table(results)  # every fault did happen


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
    result = Result("storage x", "wave", "f", "did it", 1.0, faulty, 2, differences, excused)
    text = table([result])
    assert "DIVERGENT" in text and "ended ''" in text and "(allowed)" in text
    assert summary([result]) == {"chaos_runs": 1, "chaos_divergent": 1}
