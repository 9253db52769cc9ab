"""Start Azurite's Table service on a free loopback port, for the demo, the bench and tests.

The demo must run on a fresh machine with only Python and Node, so state lives in a real
Azurite (the same Table API the function app uses in Azure) held in memory and thrown away
when the demo stops. The test fixture in tests/conftest.py does the same; this module is
the one place a non-test caller (demo, bench) can get it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from datetime import UTC
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

ROOT = Path(__file__).resolve().parents[1]

# Azurite's documented development account. It is public and only ever used on loopback.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


class AzuriteError(RuntimeError):
    """Azurite is not installed, Node is missing, or it did not start listening."""


class _PortTaken(Exception):
    """The free port was bound by another process before Azurite could listen on it."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AzuriteError(f"Azurite exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AzuriteError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def connection_string(port: int) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"TableEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
    )


EXIT_WITH_PARENT = Path(__file__).resolve().parent / "exit_with_parent.cjs"
# The tests' save and restore of a table prefix (the crash explorer's checkpoints).
CHECKPOINTS = Path(__file__).resolve().parent / "azurite_checkpoint.cjs"


def node(root: Path = ROOT) -> str | None:
    """The Node.js that runs the project's Node tools: node_modules/.bin/node where
    package.json pins one, else the machine's."""
    pinned = root / "node_modules" / ".bin" / "node"
    if pinned.exists():
        return str(pinned)
    return shutil.which("node")


class Azurite:
    """A running Azurite Table service; a context manager that always stops it.

    `checkpoints`: with the tests' save and restore of a table prefix
    (local/azurite_checkpoint.cjs), for the crash explorer; never for the demo."""

    def __init__(self, root: Path = ROOT, checkpoints: bool = False) -> None:
        self.root = root
        self.checkpoints = checkpoints
        self.binary = root / "node_modules" / ".bin" / "azurite-table"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._workdir: str | None = None
        self._stderr: BinaryIO | None = None

    @property
    def connection_string(self) -> str:
        return connection_string(self.port)

    def start(self, timeout: float = 30.0, attempts: int = 3) -> Azurite:
        """Start on a free port. A port is only known free until someone binds it: when
        another process (a parallel test worker's Azurite, say) takes it first, Azurite
        exits and we try again on another port, up to `attempts` times."""
        if not self.binary.exists():
            raise AzuriteError(
                f"Azurite is not installed ({self.binary} is missing): run `make install`"
            )
        if node(self.root) is None:
            raise AzuriteError("Node.js is needed to run Azurite")
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(timeout)
            except _PortTaken:
                if attempt == attempts:
                    raise AzuriteError(
                        f"Azurite did not start: {attempts} free ports were taken before it "
                        "could listen"
                    ) from None
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> Azurite:
        self.port = free_port()
        # Azurite may still write small files in its working directory: give it a private one.
        self._workdir = tempfile.mkdtemp(prefix="azurite-")
        workdir = Path(self._workdir)
        self._stderr = open(workdir / "stderr.log", "wb")  # noqa: SIM115
        with open(workdir / "stdout.log", "wb") as stdout:
            self.proc = subprocess.Popen(  # noqa: S603 - a fixed local binary, no shell
                [
                    str(node(self.root) or "node"),
                    "--require",
                    str(EXIT_WITH_PARENT),
                    *(["--require", str(CHECKPOINTS)] if self.checkpoints else []),
                    str(self.binary),
                    "--tableHost",
                    "127.0.0.1",
                    "--tablePort",
                    str(self.port),
                    "--inMemoryPersistence",
                    "--skipApiVersionCheck",
                    "--disableProductStyleUrl",
                    "--silent",
                    # No usage telemetry from tests and benches (nothing here may reach out),
                    # and its per-request bookkeeping was a fifth of Azurite's CPU.
                    "--disableTelemetry",
                    # Idle kept-alive connections stay open 5 minutes, not Azurite's 5 s:
                    # on a busy machine a client reused one just as Azurite closed it
                    # (a connection reset mid-bench).
                    "--tableKeepAliveTimeout",
                    "300",
                ],
                # Azurite exits when this pipe closes: a killed test run leaves none behind.
                stdin=subprocess.PIPE,
                stdout=stdout,
                stderr=self._stderr,
                cwd=self._workdir,
                start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not Node's
            )
        try:
            self._wait_started(workdir, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_started(self, workdir: Path, timeout: float) -> None:
        """Until Azurite says it listens. Its "successfully started" line follows its
        listen() (azurite/dist/src/table/main.js), so the port is this process's own: a
        connection alone could reach another Azurite that took the port first."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            said = (workdir / "stdout.log").read_text(errors="replace")
            if "successfully started" in said and self.proc.poll() is None:
                wait_for_port(self.port, max(0.1, deadline - time.monotonic()), self.proc)
                return
            if self.proc.poll() is not None:
                err = (workdir / "stderr.log").read_text(errors="replace")[-500:]
                if "EADDRINUSE" in err:
                    raise _PortTaken(self.port)
                raise AzuriteError(
                    f"Azurite did not start: it exited with code {self.proc.returncode}. "
                    f"{err}".strip()
                )
            time.sleep(0.05)
        raise AzuriteError(
            f"Azurite did not start: not listening on 127.0.0.1:{self.port} after {timeout}s"
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> Azurite:
        return self.start() if self.proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def table_url(connection_string: str, table: str) -> str:
    """A table's URL on the endpoint a connection string names (Azurite: /ACCOUNT/TABLE)."""
    parts = dict(
        item.split("=", 1) for item in connection_string.strip(";").split(";") if "=" in item
    )
    return f"{parts['TableEndpoint'].rstrip('/')}/{table}"


def table_sas(table: str, permission: str = "au", hours: float = 24.0) -> str:
    """A SAS query string for one Azurite table, signed with the well-known development key:
    by default add + update only, what a relay needs to merge its heartbeat (no read, no
    delete), as the liveness role grants the relay's identity in Azure."""
    from datetime import datetime, timedelta

    from azure.core.credentials import AzureNamedKeyCredential
    from azure.data.tables import TableSasPermissions, generate_table_sas

    return generate_table_sas(
        AzureNamedKeyCredential(AZURITE_ACCOUNT, AZURITE_KEY),
        table,
        permission=TableSasPermissions(_str=permission),
        expiry=datetime.now(UTC) + timedelta(hours=hours),
    )
