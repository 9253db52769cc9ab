"""local/stopping.py: once the demo stops, a request of the host's session waiting for its
answer ends, none goes out any more, and a wait of the host's clock ends (issue 46, 7d: a
drain run's hook call or retry wait outlived the demo's stop)."""

from __future__ import annotations

import socket
import threading

import pytest

from local.stopping import Stopped, StopSignal


def _ends(target) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, raised


def test_a_request_waiting_for_its_answer_ends_when_the_demo_stops():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/drain"
        stop = StopSignal()
        session = stop.session()
        thread, raised = _ends(lambda: session.post(url, data=b"{}", timeout=(5, 120)))
        connection, _ = listener.accept()  # the hook took the request and never answers
        with connection:
            received = b""
            while b"\r\n\r\n" not in received:
                received += connection.recv(4096)
            stop.set()
            thread.join(5)
            assert not thread.is_alive()  # not the 120 s the hook had
            assert len(raised) == 1 and isinstance(raised[0], Stopped), raised
            with pytest.raises(Stopped):  # nothing goes out any more
                session.post(url, data=b"{}", timeout=(5, 120))


def test_a_wait_ends_when_the_demo_stops():
    stop = StopSignal()
    clock = stop.clock()
    thread, raised = _ends(lambda: clock.sleep(120))
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], Stopped), raised
    with pytest.raises(Stopped):
        clock.sleep(0)
