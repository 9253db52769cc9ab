"""How the demo runs one real relay per VM: its command line, environment and drain hook.

The relays are the same `python -m relay` a VM runs, with the demo's loopback endpoints:
IMDS from the simulator, forwarding into the shared inbox (the local stand-in for the
Service Bus queue), a callback listener for StartRequests, and a drain hook script.
"""

from __future__ import annotations

import sys
from pathlib import Path

from local.plan import VmSpec


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
    port: int,
    key_file: Path,
    hook: Path,
    advertise: str | None = None,
    heartbeat_table: tuple[str, Path] | None = None,
) -> list[str]:
    """`advertise`: the callback URL the relay announces, if not its own (a callback that
    is down: the demo's ARM fallback). `heartbeat_table`: (table URL, SAS file) where the
    relay writes its heartbeats, as deployed relays do (relay.liveness)."""
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
        "--callback-listen",
        f"127.0.0.1:{port}",
        "--callback-key-file",
        str(key_file),
        "--callback-url",
        advertise or relay_callback_url(port),
        "--log-format",
        "text",
        "--hook",
        f"drain={hook}",
        "--hook-timeout",
        "5",
    ]
    if vm.availability_set:
        argv += ["--availability-set", vm.availability_set]
    if heartbeat_table is not None:
        url, sas_file = heartbeat_table
        argv += ["--heartbeat-table", url, "--heartbeat-table-sas-file", str(sas_file)]
    return argv


def relay_callback_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def relay_env(env: dict[str, str]) -> dict[str, str]:
    """The demo's environment without RELAY_* (the command line says everything)."""
    child = {k: v for k, v in env.items() if not k.startswith("RELAY_")}
    child["PYTHONUNBUFFERED"] = "1"
    return child
