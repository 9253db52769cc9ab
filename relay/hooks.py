"""Named local hook scripts (e.g. drain before a scale-set Terminate), run at most once.

The relay only ever runs scripts named in its own configuration; a caller picks one by
name and never sends a command. Each (hook, EventId) runs once: its result is kept in the
state directory, so a repeated call, or a call after a relay restart, returns the first
run's result instead of draining twice. A script runs in a session of its own, so it
outlives a relay killed meanwhile; it writes its exit status to a file the relay opened
for it (`{digest}.rc`, its output beside it), and the relay started again takes the run
over: its status when it has ended, waited for while it runs (issue 40: a relay killed in
its drain no longer reports a drain that ran as failed). A run whose end nobody can know
(the VM rebooted, the status never written) is reported as failed, not rerun: a
half-drained node is for a person (or the policy) to judge.

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
        key = self._key(name, event_id)
        if record.get("status") == RUNNING and key not in self._active:
            # Started by an earlier relay process that died before it finished.
            if _exit_code(self._rc(record)) is None and _alive(record):
                done = self._active[key] = threading.Event()
                threading.Thread(target=self._adopt, args=(record, done), daemon=True).start()
                return record
            self._finish(record, None)
        return record

    def _rc(self, record: dict[str, Any]) -> Path:
        return self._path(record["Hook"], record["EventId"]).with_suffix(".rc")

    def _adopt(self, record: dict[str, Any], done: threading.Event) -> None:
        """Wait for a run an earlier relay started, then record how it ended."""
        status = None
        while _alive(record):
            if time.time() - record.get("started", 0) > self.timeout:
                _kill_group(record["pid"])
                status = TIMEOUT
            time.sleep(0.2)
        with self._lock:
            self._finish(record, status)
            self._active.pop(self._key(record["Hook"], record["EventId"]), None)
        done.set()

    def _finish(self, record: dict[str, Any], status: str | None, code: Any = None) -> None:
        """Record a run's end (under the lock): `status` None = from its status file."""
        rc = self._rc(record)
        out = rc.with_suffix(".out")
        unknown = False
        if status is None:
            code = _exit_code(rc)
            status, unknown = SUCCEEDED if code == 0 else FAILED, code is None
        tail = record.get("output_tail") or ""
        with contextlib.suppress(OSError), open(out, "rb") as output:
            output.seek(0, os.SEEK_END)
            output.seek(max(0, output.tell() - OUTPUT_TAIL_BYTES))
            tail = output.read().decode("utf-8", "replace")
        if unknown:
            tail = (
                "the relay restarted while this hook was running and its end is unknown; not rerun"
            )
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
        status: str | None = SUCCEEDED
        exit_code: int | None = 0
        if script is not None:  # None: a built-in hook (relay.ready's): nothing to run
            status, exit_code = self._exec(script, env, record)
        with self._lock:
            self._finish(record, status, exit_code)
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

    def _exec(
        self, script: Path, env: dict[str, str], record: dict[str, Any]
    ) -> tuple[str | None, int | None]:
        """Run one script as the hook user; its output and exit status go to files beside
        the record: (status, exit code), status None when its status file says."""
        status, exit_code = None, None
        switch: dict[str, Any] = {}
        if self.user.uid is not None:
            switch = {"user": self.user.uid, "group": self.user.gid, "extra_groups": []}
        rc_path = self._rc(record)
        with open(rc_path.with_suffix(".out"), "wb") as output, open(rc_path, "wb") as rc:
            try:
                # `sh` writes the script's exit status to the file the relay opened, given
                # as sh's fd 0 (the script's stdin is /dev/null): a relay killed meanwhile
                # learns it when it starts again (the file is the relay's; the script's user
                # only holds the open descriptor).
                proc = subprocess.Popen(  # noqa: S603 - only scripts from the relay's own config
                    ["/bin/sh", "-c", '"$0" </dev/null; echo $? >&0', str(script)],
                    stdin=rc,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd="/",
                    start_new_session=True,
                    **switch,
                )
            except OSError as exc:
                status = FAILED
                output.write(f"cannot start {script}: {exc.strerror or exc}".encode())
            else:
                with self._lock:
                    record.update(pid=proc.pid, boot=_boot(), started=time.time())
                    self._store(record)
                try:
                    proc.wait(timeout=self.timeout)
                except subprocess.TimeoutExpired:
                    status = TIMEOUT
                    _kill_group(proc.pid)
                    exit_code = proc.wait()
        return status, exit_code


def _not_before(scheduled: ScheduledEvent) -> str:
    """RFC 1123 GMT; a time Python cannot hold is passed on as IMDS wrote it."""
    moment = scheduled.not_before
    return format_not_before(moment) if moment is not None else scheduled.not_before_text


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _exit_code(rc: Path) -> int | None:
    """The exit status a script's `sh` wrote, or None if it wrote none (yet)."""
    try:
        return int(rc.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _boot() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _alive(record: dict[str, Any]) -> bool:
    """Whether the run's process still runs: its pid, in this boot of the VM."""
    pid = record.get("pid")
    if not isinstance(pid, int) or record.get("boot") != _boot():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it runs as the hook user
    try:  # a zombie no one has reaped yet has ended
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


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
