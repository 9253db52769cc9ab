"""functions.deadline: one exchange within one deadline, whatever the peer does.

Real sockets on loopback: a peer that drips its answer one byte at a time (each byte well
within any per-read timeout), one that never answers, one that answers at once, and one
that sends far more than an answer."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from functions.deadline import DeadlineExceeded, exchange

ANSWER = (
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'
)


@pytest.fixture
def peer() -> Iterator[tuple[str, dict[str, object]]]:
    """A loopback server whose behaviour the test sets: "drip", "hang", "fast", "flood"."""
    mode: dict[str, object] = {"how": "fast"}
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            how = mode["how"]
            if how == "fast":
                conn.sendall(ANSWER)
            elif how == "drip":
                for byte in ANSWER:
                    if stop.is_set():
                        return
                    conn.send(bytes([byte]))
                    time.sleep(0.2)
            elif how == "hang":
                stop.wait(30)
            elif how == "flood":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n")
                conn.sendall(b"x" * 10_000_000)
        except OSError:
            pass
        finally:
            conn.close()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/v1/start", mode
    finally:
        stop.set()
        server.close()


def test_an_answer_in_time_is_read_whole(peer):
    url, _ = peer
    response = exchange("POST", url, seconds=5, data=b"{}")
    assert response.status_code == 200 and response.json() == {"ok": True}


@pytest.mark.parametrize("how", ["drip", "hang"])
def test_a_dripping_or_silent_peer_costs_the_deadline_and_no_more(peer, how):
    """requests' own timeout would wait 0.2 s per byte for ever (each read is quick);
    the whole exchange ends at its deadline, with an exception that says so."""
    url, mode = peer
    mode["how"] = how
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"no whole answer within 1\.0 s"):
        exchange("POST", url, seconds=1.0, data=b"{}")
    assert time.monotonic() - started < 2.0
    assert issubclass(DeadlineExceeded, requests.Timeout)  # callers retry it as a timeout


def test_a_flood_is_cut_at_the_answer_limit(peer):
    url, mode = peer
    mode["how"] = "flood"
    response = exchange("POST", url, seconds=5, data=b"{}", max_bytes=1000)
    assert len(response.content) == 1000


def test_no_time_left_sends_nothing(peer):
    url, _ = peer
    with pytest.raises(DeadlineExceeded, match="no time left"):
        exchange("POST", url, seconds=0, data=b"{}")


def test_the_url_in_the_message_leaves_the_query_out(peer):
    url, mode = peer
    mode["how"] = "hang"
    with pytest.raises(DeadlineExceeded) as raised:
        exchange("POST", url + "?sig=secret", seconds=0.3, data=b"{}")
    assert "secret" not in str(raised.value)
