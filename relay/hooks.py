"""Named local hook scripts (e.g. drain before a scale-set Terminate), run at most once.

The relay only ever runs scripts named in its own configuration; a caller picks one by
name and never sends a command. Each (hook, EventId) runs once: its result is kept in the
state directory, so a repeated call, or a call after a relay restart, returns the first
run's result instead of draining twice. A run whose end nobody can know (the VM rebooted,
no status written) is reported as failed, not rerun: a half-drained node is for a person
(or the policy) to judge.

The hook unit (issue 38): the relay runs sandboxed (ProtectSystem=strict, no capabilities,
a user of its own), and a drain needs more (`systemctl`, `nginx -s quit`, the docker
socket). So the relay never runs a script itself: it connects to `--hook-socket`
(default /run/scheduled-events-relay-hooks.sock), where systemd listens
(scheduled-events-relay-hook.socket, `Accept=yes`) and starts one
scheduled-events-relay-hook@ instance per run, as the user, groups and capabilities its
drop-in states (add-relay.sh writes it from HOOK_AS; install.sh installs the units), outside
the relay's sandbox and never as the relay's user, so a hook cannot read its callback key.
The instance is `serve_hook` (`scheduled-events-relay.pyz run-hook`). The relay only names a
hook; the instance looks the name up in its own RELAY_HOOKS (the env files, root's) and
passes on nothing but the SCHEDULED_EVENT_* values, so a relay that was taken over can run
the operator's scripts by name, as before, and nothing else. Off a VM, local/hook_unit.py
stands in for systemd.

One message in, with two open files of the relay's passed along (SCM_RIGHTS): `{digest}.out`
for the script's output and `{digest}.rc` for how it ended (its exit status, `timeout` or
`failed`); the instance writes them, and closes the connection when it is over. The files
are the relay's (0600 in its 0700 state directory); the instance only holds descriptors.
The relay holds an flock on the `.rc` file's open description before it sends it, so the
lock lasts as long as any holder of that description: a relay killed meanwhile (issue 40)
finds the lock still held when it starts again, waits for it, and reports how the script
ended instead of "failed".

A hook whose path is None is built in (relay.ready's `readyz:drain`, `readyz:undrain`): it
runs no script, needs no hook unit, and is recorded and observed like any other.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from relay.logs import event
from relay.models import ScheduledEvent, format_not_before
from relay.outbox import atomic_write
from relay.signing import sha256

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("relay.hooks")

OUTPUT_TAIL_BYTES = 2048
SUCCEEDED, FAILED, TIMEOUT, RUNNING = "succeeded", "failed", "timeout", "running"
MAX_REQUEST = 64 * 1024
ENV_PREFIX = "SCHEDULED_EVENT_"


class HookRunner:
    def __init__(
        self,
        hooks: dict[str, Path | None],
        state_dir: Path,
        timeout: float,
        vm_name: str,
        socket: str,
        observer: Any = None,
    ) -> None:
        self.socket = socket  # the hook unit's (above): every script runs there
        # observer (relay.ready.Readiness): hook_started(name, EventId, undoes) before a
        # script runs, hook_finished(name, EventId, undoes, status) once it is over.
        self.observer = observer
        self.hooks = dict(hooks)
        self.directory = state_dir / "hooks"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        self.vm_name = vm_name
        self._lock = threading.Lock()
        self._active: dict[str, threading.Event] = {}

    def known(self, name: str) -> bool:
        return name in self.hooks

    def _path(self, name: str, event_id: str) -> Path:
        digest = sha256(f"{name}\0{event_id.casefold()}".encode()).hexdigest()[:32]
        return self.directory / f"{digest}.json"

    def _store(self, record: dict[str, Any]) -> None:
        atomic_write(self._path(record["Hook"], record["EventId"]), json.dumps(record).encode())

    def result(self, name: str, event_id: str) -> dict[str, Any] | None:
        """The recorded outcome of (hook, EventId), or None if it never ran."""
        with self._lock:
            return self._result_locked(name, event_id)

    def _result_locked(self, name: str, event_id: str) -> dict[str, Any] | None:
        try:
            record = json.loads(self._path(name, event_id).read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            record = {"Hook": name, "EventId": event_id, "status": RUNNING}
        key = self._key(name, event_id)
        if record.get("status") == RUNNING and key not in self._active:
            # Started by an earlier relay process that died before it recorded the end.
            held = _held(self._rc(record))
            if held:  # the hook unit still runs it: wait for it (issue 40)
                done = self._active[key] = threading.Event()
                threading.Thread(target=self._adopt, args=(record, held, done), daemon=True).start()
                return record
            self._finish(record)
        return record

    def _rc(self, record: dict[str, Any]) -> Path:
        return self._path(record["Hook"], record["EventId"]).with_suffix(".rc")

    def _adopt(self, record: dict[str, Any], held: Any, done: threading.Event) -> None:
        """Wait for a run an earlier relay started (its lock), then record how it ended."""
        with held:
            fcntl.flock(held, fcntl.LOCK_SH)
        with self._lock:
            self._finish(record)
            self._active.pop(self._key(record["Hook"], record["EventId"]), None)
        done.set()

    def _finish(self, record: dict[str, Any], status: str | None = None, code: Any = None) -> None:
        """Record a run's end (under the lock): `status` None = as its `.rc` file says."""
        rc = self._rc(record)
        out = rc.with_suffix(".out")
        unknown = False
        if status is None:
            try:
                ended = rc.read_text().strip()
            except OSError:
                ended = ""
            status = ended if ended in (TIMEOUT, FAILED) else FAILED
            with contextlib.suppress(ValueError):
                code = int(ended)
                status = SUCCEEDED if code == 0 else FAILED
            unknown = not ended
        tail = record.get("output_tail") or ""
        with contextlib.suppress(OSError), open(out, "rb") as output:
            output.seek(0, os.SEEK_END)
            output.seek(max(0, output.tell() - OUTPUT_TAIL_BYTES))
            tail = output.read().decode("utf-8", "replace")
        if unknown:
            tail = "its end is unknown (the relay, its hook unit or the VM stopped); not rerun"
        record.update(status=status, exit_code=code, output_tail=tail, finished_at=_now())
        if self.observer:  # before the result can be read: the probe is never behind it
            self.observer.hook_finished(
                record["Hook"], record["EventId"], record.get("Undoes"), status
            )
        try:
            self._store(record)
        except OSError as exc:
            event(log, logging.ERROR, "cannot record hook result", error=str(exc))
        for path in (rc, out):
            path.unlink(missing_ok=True)

    @staticmethod
    def _key(name: str, event_id: str) -> str:
        return f"{name}\0{event_id.casefold()}"

    def run_once(
        self, name: str, scheduled: ScheduledEvent, wait: float, undoes: str | None = None
    ) -> dict[str, Any]:
        """Start the hook for this event unless it ever ran; wait up to `wait` seconds.
        `undoes`: the hook this run undoes (an undrain's `Undoes`), kept in the record."""
        key = self._key(name, scheduled.event_id)
        with self._lock:
            existing = self._result_locked(name, scheduled.event_id)
            if existing is not None:
                done = self._active.get(key)
                if done is None:
                    return existing
            else:
                record = {
                    "Hook": name,
                    "EventId": scheduled.event_id,
                    "status": RUNNING,
                    "exit_code": None,
                    "output_tail": "",
                    "started_at": _now(),
                    "Undoes": undoes,
                }
                self._store(record)  # durable before the script can have any effect
                if self.observer:
                    self.observer.hook_started(name, scheduled.event_id, undoes)
                done = threading.Event()
                self._active[key] = done
                threading.Thread(
                    target=self._run,
                    args=(name, scheduled, record, done),
                    name=f"hook-{name}",
                    daemon=True,
                ).start()
        done.wait(wait)
        return self.result(name, scheduled.event_id) or {}

    def _run(
        self, name: str, scheduled: ScheduledEvent, record: dict[str, Any], done: threading.Event
    ) -> None:
        env = {
            "SCHEDULED_EVENT_HOOK": name,
            "SCHEDULED_EVENT_ID": scheduled.event_id,
            "SCHEDULED_EVENT_TYPE": scheduled.event_type,
            "SCHEDULED_EVENT_STATUS": scheduled.event_status,
            "SCHEDULED_EVENT_NOT_BEFORE": _not_before(scheduled),
            "SCHEDULED_EVENT_RESOURCES": ",".join(scheduled.resources),
            "SCHEDULED_EVENT_VM_NAME": self.vm_name,
        }
        event(log, logging.INFO, "hook started", hook=name, event_id=scheduled.event_id)
        began = time.monotonic()
        status: str | None = SUCCEEDED
        code: int | None = 0
        if self.hooks[name] is not None:  # None: a built-in hook (relay.ready's): nothing to run
            status, code = self._exec(name, env, record), None
        with self._lock:
            self._finish(record, status, code)
            self._active.pop(self._key(name, scheduled.event_id), None)
        record["seconds"] = round(time.monotonic() - began, 3)
        done.set()
        event(
            log,
            logging.INFO if record["status"] == SUCCEEDED else logging.WARNING,
            "hook finished",
            hook=name,
            event_id=scheduled.event_id,
            status=record["status"],
            exit_code=record["exit_code"],
        )

    def _exec(self, name: str, env: dict[str, str], record: dict[str, Any]) -> str | None:
        """Have the hook unit run hook `name`, its output and end written to the files
        beside the record: None (the `.rc` file says how it ended), or the status when the
        unit could not be asked or did not answer in time."""
        rc = self._rc(record)
        request = json.dumps({"hook": name, "env": env}).encode() + b"\n"
        with open(rc.with_suffix(".out"), "wb") as out, open(rc, "wb") as ended:
            # Held by this open description, wherever it is: here, and in the hook unit
            # until the run is over, even if this relay is killed meanwhile (_held).
            fcntl.flock(ended, fcntl.LOCK_EX)
            try:
                with socket.socket(socket.AF_UNIX) as conn:
                    conn.settimeout(self.timeout + 15)  # the unit enforces its own limit
                    conn.connect(self.socket)
                    socket.send_fds(conn, [request], [out.fileno(), ended.fileno()])
                    conn.recv(1)  # the unit closes the connection once the run is over
            except socket.timeout:
                return TIMEOUT
            except OSError as exc:
                out.write(f"cannot run the hook through {self.socket}: {exc}".encode())
                return FAILED
        return None


def _held(rc: Path) -> Any:
    """The `.rc` file, opened, if a run still holds its lock (else None)."""
    try:
        held = open(rc, "rb")  # noqa: SIM115 - closed by the caller, or here
    except OSError:
        return None
    try:
        fcntl.flock(held, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return held
    held.close()
    return None


def _not_before(scheduled: ScheduledEvent) -> str:
    """RFC 1123 GMT; a time Python cannot hold is passed on as IMDS wrote it."""
    moment = scheduled.not_before
    return format_not_before(moment) if moment is not None else scheduled.not_before_text


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def public(record: dict[str, Any]) -> dict[str, Any]:
    """The answer's fields, exactly the contract: Hook, EventId, status, exit_code, output_tail."""
    return {
        "Hook": record.get("Hook"),
        "EventId": record.get("EventId"),
        "status": record.get("status"),
        "exit_code": record.get("exit_code"),
        "output_tail": record.get("output_tail", ""),
    }


# ---------------------------------------------------------------- in the hook unit


def serve_hook(conn: socket.socket, hooks: dict[str, Path], timeout: float) -> int:
    """One run, in the hook unit (`conn`: the accepted connection): the script its own
    `hooks` names, its output and how it ended written to the two files the relay sent."""
    data, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 2)
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return 2
    with open(fds[0], "wb") as out, open(fds[1], "w") as ended:
        if not data.endswith(b"\n"):
            data += conn.makefile("rb").readline(MAX_REQUEST)
        result = FAILED
        try:
            request = json.loads(data)
            script = hooks[request["hook"]]
            env = {k: str(v) for k, v in request["env"].items() if k.startswith(ENV_PREFIX)}
        except (ValueError, KeyError, TypeError, AttributeError):
            out.write(b"not a hook this VM's relay configuration names")
        else:
            env.update(PATH=os.environ.get("PATH", "/usr/bin:/bin"), LANG="C.UTF-8")
            try:
                result = str(
                    subprocess.run(  # noqa: S603 - a script the unit's own RELAY_HOOKS names
                        [str(script)],
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd="/",
                        timeout=timeout,
                    ).returncode
                )
            except subprocess.TimeoutExpired:
                result = TIMEOUT
            except (OSError, ValueError) as exc:  # ValueError: a NUL in a value
                out.write(f"cannot start {script}: {exc}".encode())
        ended.write(result)
    return 0


def run_hook() -> int:
    """`scheduled-events-relay.pyz run-hook`: the hook unit's ExecStart (the connection
    is its standard input)."""
    from relay.settings import _hooks

    hooks = _hooks(os.environ.get("RELAY_HOOKS") or "{}")
    timeout = float(os.environ.get("RELAY_HOOK_TIMEOUT") or 120)
    with socket.socket(fileno=0) as conn:
        return serve_hook(conn, hooks, timeout)
