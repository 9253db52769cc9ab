"""Named local hook scripts (e.g. drain before a scale-set Terminate), run at most once.

The relay only ever runs scripts named in its own configuration; a caller picks one by
name and never sends a command. Each (hook, EventId) runs once: its result is kept in the
state directory, so a repeated call, or a call after a relay restart, returns the first
run's result instead of draining twice. A run a crash interrupted is reported as failed,
not rerun: a half-drained node is for a person (or the policy) to judge.

Scripts run as another user (`--hook-user`, default `nobody`), so a hook (or whatever it
runs) cannot read the relay's callback key (relay.keystore, 0600 in a 0700 directory). The
relay switches user for the child only (subprocess `user=`/`group=`, supplementary groups
cleared), which needs root or CAP_SETUID + CAP_SETGID (the systemd unit grants these two
and nothing else; `drop_ambient_capabilities` keeps them from reaching the script). A relay
that cannot switch runs hooks as itself only when `--hook-user` names its own user
explicitly; otherwise hook calls are refused (503) and the reason is logged at start.

A hook whose path is None is built in (relay.ready's `readyz:drain`, `readyz:undrain`): it
runs no script, needs no hook user, and is recorded and observed like any other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
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


CAP_SETGID, CAP_SETUID = 6, 7
DEFAULT_HOOK_USER = "nobody"


class HookUser:
    """Who hooks run as: `uid`/`gid` None = as the relay itself; `problem` = refuse hooks."""

    def __init__(
        self, name: str, uid: int | None, gid: int | None, problem: str | None = None
    ) -> None:
        self.name, self.uid, self.gid, self.problem = name, uid, gid, problem


def _capabilities(field: str = "CapEff") -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def can_switch_user() -> bool:
    if os.geteuid() == 0:
        return True
    wanted = (1 << CAP_SETUID) | (1 << CAP_SETGID)
    return _capabilities() & wanted == wanted


def resolve_hook_user(configured: str | None) -> HookUser:
    """The user hooks run as (`configured`, None = the default `nobody`), and whether the
    relay can run them so."""
    import pwd

    name = configured or DEFAULT_HOOK_USER
    me = os.geteuid()
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        return HookUser(name, None, None, f"hooks disabled: no user {name!r} (--hook-user)")
    try:
        own = pwd.getpwuid(me).pw_name
    except KeyError:
        own = str(me)
    if entry.pw_uid == me:
        if configured:
            return HookUser(name, None, None)  # asked for explicitly: run as the relay
        return HookUser(
            name,
            None,
            None,
            f"hooks disabled: the default hook user {name!r} is the relay's own user; set "
            f"--hook-user {own} explicitly to run hooks as the relay (they could then read "
            "its callback key), or run the relay as another user",
        )
    if not can_switch_user():
        return HookUser(
            name,
            None,
            None,
            f"hooks disabled: the relay (user {own}) cannot switch to the hook user {name!r}: "
            "run it as root or with CAP_SETUID and CAP_SETGID (the systemd unit grants "
            f"them), or set --hook-user {own} to run hooks as the relay itself (they could "
            "then read its callback key)",
        )
    return HookUser(name, entry.pw_uid, entry.pw_gid)


def drop_ambient_capabilities() -> None:
    """Clear this thread's ambient capabilities (systemd's AmbientCapabilities puts
    CAP_SETUID/CAP_SETGID there), keeping them effective for the relay itself: an ambient
    capability survives exec, so a hook script would inherit it and could switch back to
    the relay's user. Capabilities are per thread: call this before starting any thread."""
    if not _capabilities("CapAmb"):
        return
    import ctypes  # only on a relay started with ambient capabilities

    libc = ctypes.CDLL(None, use_errno=True)
    pr_cap_ambient, pr_cap_ambient_clear_all = 47, 4
    if libc.prctl(pr_cap_ambient, pr_cap_ambient_clear_all, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAP_AMBIENT_CLEAR_ALL) failed")


class HookRunner:
    def __init__(
        self,
        hooks: dict[str, Path | None],
        state_dir: Path,
        timeout: float,
        vm_name: str,
        user: HookUser | None = None,
        observer: Any = None,
    ) -> None:
        # observer (relay.ready.Readiness): hook_started(name, EventId, undoes) before a
        # script runs, hook_finished(name, EventId, undoes, status) once it is over.
        self.observer = observer
        self.user = user or HookUser("(relay)", None, None)
        self.disabled = self.user.problem
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
        if record.get("status") == RUNNING and self._key(name, event_id) not in self._active:
            # Started by an earlier relay process that died before it finished.
            record.update(
                status=FAILED,
                exit_code=None,
                output_tail="the relay restarted while this hook was running; not rerun",
                finished_at=_now(),
            )
            if self.observer:  # before the result can be read: the probe is never behind it
                self.observer.hook_finished(name, event_id, record.get("Undoes"), FAILED)
            self._store(record)
        return record

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
        script = self.hooks[name]
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
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
        status, exit_code, tail = SUCCEEDED, 0, ""
        if script is not None:  # None: a built-in hook (relay.ready's): nothing to run
            status, exit_code, tail = self._exec(script, env)
        record.update(
            status=status,
            exit_code=exit_code,
            output_tail=tail,
            finished_at=_now(),
            seconds=round(time.monotonic() - began, 3),
        )
        with self._lock:
            if self.observer:  # before the result can be read: the probe is never behind it
                self.observer.hook_finished(name, scheduled.event_id, record["Undoes"], status)
            try:
                self._store(record)
            except OSError as exc:
                event(log, logging.ERROR, "cannot record hook result", error=str(exc))
            self._active.pop(self._key(name, scheduled.event_id), None)
        done.set()
        event(
            log,
            logging.INFO if status == SUCCEEDED else logging.WARNING,
            "hook finished",
            hook=name,
            event_id=scheduled.event_id,
            status=status,
            exit_code=exit_code,
        )

    def _exec(self, script: Path, env: dict[str, str]) -> tuple[str, int | None, str]:
        """Run one script as the hook user: (status, exit code, the tail of its output)."""
        status, exit_code, tail = FAILED, None, ""
        switch: dict[str, Any] = {}
        if self.user.uid is not None:
            switch = {"user": self.user.uid, "group": self.user.gid, "extra_groups": []}
        with tempfile.TemporaryFile(dir=self.directory) as output:
            try:
                proc = subprocess.Popen(  # noqa: S603 - only scripts from the relay's own config
                    [str(script)],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd="/",
                    start_new_session=True,
                    **switch,
                )
            except OSError as exc:
                tail = f"cannot start {script}: {exc.strerror or exc}"
            else:
                try:
                    exit_code = proc.wait(timeout=self.timeout)
                    status = SUCCEEDED if exit_code == 0 else FAILED
                except subprocess.TimeoutExpired:
                    status = TIMEOUT
                    _kill_group(proc)
                    exit_code = proc.wait()
                output.seek(0, os.SEEK_END)
                size = output.tell()
                output.seek(max(0, size - OUTPUT_TAIL_BYTES))
                tail = output.read().decode("utf-8", "replace")
        return status, exit_code, tail


def _not_before(scheduled: ScheduledEvent) -> str:
    """RFC 1123 GMT; a time Python cannot hold is passed on as IMDS wrote it."""
    moment = scheduled.not_before
    return format_not_before(moment) if moment is not None else scheduled.not_before_text


def _kill_group(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


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
