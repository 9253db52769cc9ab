"""A TCP proxy in front of Azurite that can refuse connections, for the chaos suite.

Storage "refusing" is what a client sees when the service's endpoint is closed: a new
connection is refused (ECONNREFUSED) and one that was open is reset. The proxy forwards
byte for byte while `refusing` is off; turned on, it closes its listening socket and
resets every connection it carries; turned off, it listens again on the same port. The
clients (the local host, the drain worker, the relays' liveness writes) are configured
with the proxy's port and never know.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class RefusingProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target_port = target_port
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self.client_chunks = 0  # reads from clients forwarded (a fault's trace: traffic)

    def start(self) -> RefusingProxy:
        self._listen()
        return self

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed: refusing, or stopped
            try:
                upstream = socket.create_connection((self.host, self.target_port))
            except OSError:
                _reset(client)
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                refusing = self._listener is not listener  # refused while we connected
                if not refusing:
                    self._conns.update((client, upstream))
            if refusing:
                _reset(client)
                _reset(upstream)
                continue
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, client: bool = False) -> None:
        try:
            while data := source.recv(65536):
                if client:
                    self.client_chunks += 1
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
            with self._lock:
                self._conns.discard(source)
            with contextlib.suppress(OSError):
                source.close()

    def refuse(self) -> int:
        """Close the endpoint: new connections refused, open ones reset (their number)."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = set(self._conns), set()
        if listener is not None:
            with contextlib.suppress(OSError):  # wakes the accept() blocked on it (Linux)
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in conns:
            _reset(sock)
        return len(conns)

    def accept(self) -> None:
        """Listen again on the same port."""
        if self._listener is None and not self._stopped:
            self._listen()

    def stop(self) -> None:
        self._stopped = True
        self.refuse()


def _reset(sock: socket.socket) -> None:
    """Close at once, as a closed endpoint does: shutdown first, since a close() alone
    waits while a pump thread is blocked reading the socket (Linux), and the client would
    wait for an answer that never comes; then close with SO_LINGER 0 (a RST)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
