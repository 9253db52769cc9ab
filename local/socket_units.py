"""systemd's socket units, played here: a port held by this process, passed to the ones it runs.

On a VM, scheduled-events-relay-ready.socket and scheduled-events-relay-callback.socket make
systemd (root) bind the readiness and callback ports at boot and hand the listening sockets
to the responder and the relay each time they start (sd_listen_fds(3): fds from 3,
LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID). The tests and the local stack need the same thing
without systemd as PID 1: `hold()` binds a port the way a socket unit does (IPv6 and IPv4,
one socket) and keeps it for as long as the caller lives, and `command()` starts a program
with held sockets passed exactly as systemd passes them, so a responder or relay killed and
started again finds the same socket, and a probe made meanwhile waits in its queue.
"""

from __future__ import annotations

import socket
import sys

# Moves the passed sockets to fds 3.., states them, and becomes the program (same pid, so
# LISTEN_PID is right).
_LAUNCH = (
    "import fcntl,os,sys\n"
    "fds=[int(f) for f in sys.argv[2].split(',')]\n"
    "moved=[fcntl.fcntl(f,fcntl.F_DUPFD,100) for f in fds]\n"
    "for i,f in enumerate(moved):os.dup2(f,3+i);os.close(f)\n"
    "for f in fds:f<3+len(fds) or os.close(f)\n"
    "os.environ.update(LISTEN_FDS=str(len(fds)),LISTEN_FDNAMES=sys.argv[1],"
    "LISTEN_PID=str(os.getpid()))\n"
    "os.execvp(sys.argv[3],sys.argv[3:])\n"
)


def hold(port: int = 0, host: str = "::") -> socket.socket:
    """A listening socket as `ListenStream=PORT` makes one: [::]:PORT, IPv4 too."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def command(
    argv: list[str], sockets: dict[str, socket.socket]
) -> tuple[list[str], tuple[int, ...]]:
    """(argv, pass_fds) for subprocess.Popen: `argv` run with `sockets` passed as systemd
    passes them, each named (FileDescriptorName=) by its key."""
    fds = tuple(s.fileno() for s in sockets.values())
    names = ":".join(sockets)
    launch = [sys.executable, "-I", "-c", _LAUNCH, names, ",".join(map(str, fds))]
    return [*launch, *argv], fds
