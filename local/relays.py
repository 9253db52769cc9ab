"""How the demo runs one real relay per VM: its command line, environment and drain hook.

The relays are the same `python -m relay` a VM runs, with the demo's loopback endpoints:
IMDS from the simulator, forwarding into the shared inbox (the local stand-in for the
Service Bus queue), a callback listener for StartRequests, and a drain hook script.

Each relay makes its own callback key in its state directory and sends it with every
(attested) message; the app calls it only where Azure says the VM is: the simulator's
Resource Graph gives VM number N the address 127.0.0.(2+N), and every relay listens there
on the one callback port the app is configured with (RELAY_CALLBACK_PORT).
"""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

from local.plan import VmSpec

HOOK_TIMEOUT = 5  # seconds a demo hook script may run (the relays' and the hook unit's)


def write_drain_hook(workdir: Path) -> tuple[Path, Path]:
    """The drain script the relays run, and the log it appends one line per run to."""
    hook = workdir / "drain-hook.sh"
    hook_log = workdir / "drain-hook.log"
    hook.write_text(
        "#!/bin/sh\n"
        "# The demo's drain step on the VM: what a real one would do is stop taking new\n"
        "# work and finish what is in flight. The relay runs only scripts from its config.\n"
        f"log='{hook_log}'\n"
        'echo "$(date +%s.%N) $SCHEDULED_EVENT_VM_NAME $SCHEDULED_EVENT_ID" >> "$log"\n'
        'echo "drained $SCHEDULED_EVENT_VM_NAME for $SCHEDULED_EVENT_ID"\n'
    )
    hook.chmod(0o755)
    return hook, hook_log


def write_undrain_hook(workdir: Path) -> tuple[Path, Path]:
    """The undrain script (the VM back in service after its event), and its own log."""
    hook = workdir / "undrain-hook.sh"
    hook_log = workdir / "undrain-hook.log"
    hook.write_text(
        "#!/bin/sh\n"
        "# The demo's undrain step on the VM: take work again once the event is over (or\n"
        "# was cancelled). The relay runs it only where its drain hook ran for that event.\n"
        f"log='{hook_log}'\n"
        'echo "$(date +%s.%N) $SCHEDULED_EVENT_VM_NAME $SCHEDULED_EVENT_ID" >> "$log"\n'
        'echo "back in service: $SCHEDULED_EVENT_VM_NAME"\n'
    )
    hook.chmod(0o755)
    return hook, hook_log


def parse_hook_line(line: str) -> tuple[float, str, str]:
    """One line of the drain hook's log: (time.time(), VM, EventId)."""
    stamp, vm, event_id = [*line.split(), "0", "?", "?"][:3]
    return float(stamp), vm, event_id


def relay_argv(
    vm: VmSpec,
    *,
    imds_url: str,
    inbox: Path,
    state_dir: Path,
    poll_interval: float,
    listen: str | None,
    hook: Path | None,
    heartbeat_table: tuple[str, Path] | None = None,
    hook_socket: Path | None = None,
    undrain_hook: Path | None = None,
    ready_listen: str | None = None,
    heartbeat_interval: float | None = None,
    drain_file: Path | None = None,
) -> list[str]:
    """`listen`: HOST:PORT of the relay's callback server, at the VM's address (None: no
    callback listener: the demo's callback that is down, where ARM takes over).
    `heartbeat_table`: (liveness table URL, SAS file) where the relay writes its signed
    heartbeats, as deployed relays do (relay.liveness). `hook_socket`: where the hook
    unit's stand-in listens (local/hook_unit.py; default: `hooks.sock` beside `state_dir`).
    `undrain_hook`: the script that puts the VM back (`undrain`). `hook` None: no script of
    the operator's on the VM. `heartbeat_interval`: seconds, scaled like the simulator's
    clock (a relay probes at each heartbeat whether the app has its latest document, and
    sends it again if not: relay/liveness.py `SplitSender`)."""
    argv = [
        sys.executable,
        "-m",
        "relay",
        "--imds-url",
        imds_url,
        "--vm-name",
        vm.name,
        "--forward",
        f"file:{inbox}",
        "--state-dir",
        str(state_dir),
        "--poll-interval",
        str(poll_interval),
        "--log-format",
        "text",
    ]
    if listen is not None:
        argv += ["--callback-listen", listen]
    if listen is not None and hook is not None:
        # Hooks run on a signed callback, so only a relay that listens has them. The relay
        # runs no script itself: the hook unit does (on a VM systemd's, as add-relay.sh's
        # HOOK_AS says, never as the relay's user; here local/hook_unit.py's, as whoever
        # runs the demo), asked over its socket.
        argv += [
            "--hook",
            f"drain={hook}",
            "--hook-socket",
            str(hook_socket or hook_socket_path(state_dir.parent)),
            "--hook-timeout",
            str(HOOK_TIMEOUT),
        ]
        if undrain_hook is not None:
            argv += ["--hook", f"undrain={undrain_hook}"]
    if ready_listen is not None:
        argv += ["--ready-listen", ready_listen]  # the load balancer's probe (relay/ready.py)
    if drain_file is not None:  # the drain it publishes for the readiness responder
        argv += ["--drain-file", str(drain_file)]
    if vm.availability_set:
        argv += ["--availability-set", vm.availability_set]
    if heartbeat_table is not None:
        url, sas_file = heartbeat_table
        argv += ["--heartbeat-table", url, "--heartbeat-table-sas-file", str(sas_file)]
    if heartbeat_interval is not None:
        argv += ["--heartbeat-interval", f"{heartbeat_interval:g}"]
    return argv


def hook_socket_path(relays: Path) -> Path:
    """Where the demo's hook unit stand-in listens, beside the relays' state directories
    (one for all its VMs: their scripts are the same, and each run gets its VM's name from
    that VM's relay)."""
    return relays / "hooks.sock"


def relay_callback_url(address: str, port: int) -> str:
    return f"http://{address}:{port}"


def current_user() -> str:
    """The user running the demo (`id -un`): the hook unit's stand-in, and so the relays'
    hook scripts, run as it (see relay_argv)."""
    return pwd.getpwuid(os.getuid()).pw_name


def relay_env(env: dict[str, str]) -> dict[str, str]:
    """The demo's environment without RELAY_* (the command line says everything)."""
    child = {k: v for k, v in env.items() if not k.startswith("RELAY_")}
    child["PYTHONUNBUFFERED"] = "1"
    return child
