"""Start the demo's relays: one real `python -m relay` process per VM that has one.

Each forwards into the shared inbox, writes heartbeats into the liveness table and listens
for callbacks where Azure says its VM is (the simulator's address for it, the one shared
port), unless the plan says its callback is down.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import requests

from local.azurite import free_port, table_sas, table_url
from local.demo_ledger import relay_command
from local.demo_ready import COMES_BACK, ProbeWatcher
from local.options import DemoAborted
from local.relays import (
    HOOK_TIMEOUT,
    current_user,
    hook_socket_path,
    relay_argv,
    relay_callback_url,
    relay_env,
    write_drain_hook,
    write_undrain_hook,
)

if TYPE_CHECKING:
    from local.demo_state import DemoState
    from local.plan import Step, VmSpec


def start_relays(demo: DemoState) -> None:
    """One real relay process per VM, forwarding into the shared inbox, its callback
    listener where Azure says the VM is (its simulator address, the one shared port)."""
    from simulator.arm import simulated_address

    hook, demo.hook_log = write_drain_hook(demo.workdir)
    undrain, demo.undrain_log = write_undrain_hook(demo.workdir)
    # Heartbeats go into the liveness table (untrusted hints the app checks against each
    # relay's key), as in Azure: there through the relay identity's role on that table
    # only; here through a SAS of the same rights (add, update) on that table only.
    liveness_table = f"{demo.settings.state_table_prefix}liveness"
    sas_file = demo.workdir / "heartbeat-table.sas"
    sas_file.write_text(table_sas(liveness_table) + "\n", encoding="utf-8")
    heartbeat_table = (table_url(demo.connection_string, liveness_table), sas_file)
    demo.relays = {}
    demo.relay_argv = {}
    demo.callback_urls = {}
    # The hook unit: on a VM systemd runs each hook script for the relay (relay/hooks.py),
    # here local/hook_unit.py does, one for all the VMs, as whoever runs the demo.
    hook_socket = start_hook_unit(demo, {"drain": hook, "undrain": undrain})
    port = demo.callback_port
    # Each probed VM's readiness responder listens at its VM's address, a port of its own.
    ready = {
        name: f"{simulated_address(demo.sim.vm_names.index(name))}:{free_port()}"
        for name in probed_vms(demo.options.fleet, demo.options.plan)
    }
    back = {s.target for s in demo.options.plan if s.drain and s.scenario in COMES_BACK}
    # The probes a load balancer would watch: the VMs the plan drains.
    drained = back | {s.target for s in demo.options.plan if s.scenario == "terminate"}
    beat = max(1.0, round(300 / demo.options.time_scale, 1))  # Azure's 300 s, scaled
    for vm in demo.options.fleet:
        if not vm.relay:
            continue
        address = simulated_address(demo.sim.vm_names.index(vm.name))
        argv = relay_argv(
            vm,
            imds_url=demo.server.vm_url(vm.name),
            inbox=demo.inbox,
            state_dir=demo.workdir / "relays" / vm.name,
            poll_interval=demo.options.poll_interval,
            # A callback that is down: nothing listens at the VM's address, so approvals
            # through its relay fail (connection refused) and ARM takes over.
            listen=None if vm.callback_down else f"{address}:{port}",
            hook=hook if vm.hooks else None,
            heartbeat_table=heartbeat_table,
            hook_socket=hook_socket,
            undrain_hook=undrain,
            # The probe is the readiness responder's, a process of its own that outlives
            # the relay (relay/responder.py, issue 44): the relay only publishes its drain.
            drain_file=drain_file(demo, vm.name) if vm.name in ready else None,
            heartbeat_interval=beat,
        )
        demo.relay_argv[vm.name] = argv  # for a restart (local/demo_upgrade.py)
        # Under its VM's guest clock: a Freeze pauses it as it would a guest's (issue 33).
        argv = relay_command(demo, vm.name, argv)
        log = demo.workdir / "logs" / f"relay-{vm.name}.log"
        demo.relays[vm.name] = demo.stack.process(argv, log, env=relay_env(demo.options.env))
        if not vm.callback_down:
            demo.callback_urls[vm.name] = relay_callback_url(address, port)
    for vm, where in ready.items():
        start_responder(demo, vm, where)
    for vm, url in demo.callback_urls.items():
        wait_healthy(demo, vm, url)
    demo.ready_urls = {vm: f"http://{where}/readyz" for vm, where in ready.items()}
    demo.ready_probes = [
        ProbeWatcher(demo, vm, f"http://{where}") for vm, where in ready.items() if vm in drained
    ]
    demo.timeline.add(
        "demo",
        "relays",
        f"{len(demo.relays)} relays polling every "
        f"{demo.options.poll_interval:g} s, forwarding to {demo.inbox}, callbacks on port "
        f"{port} at each VM's address, heartbeats every {beat:g} s into the "
        f"{liveness_table} table, hook "
        f"scripts run by the hook unit as {current_user()} (on a VM: as add-relay.sh's "
        "HOOK_AS says)",
    )


def probed_vms(fleet: tuple[VmSpec, ...], plan: tuple[Step, ...]) -> list[str]:
    """The VMs a load balancer's readiness probe watches, each with a readiness responder
    of its own: those the plan drains that come back (a reboot: undrained once it is over),
    and every VM with no script of the operator's (a first deploy's: the bridge drains it
    through the probe, issue 38); a relay and a callback listening on each."""
    back = {s.target for s in plan if s.drain and s.scenario in COMES_BACK}
    return [
        vm.name
        for vm in fleet
        if vm.relay and (vm.name in back or not vm.hooks) and not vm.callback_down
    ]


def drain_file(demo: DemoState, vm: str) -> Path:
    """Where a VM's relay publishes its drain for the responder (on a VM: /run/...)."""
    return demo.workdir / "relays" / vm / "drain.json"


def start_responder(demo: DemoState, vm: str, where: str) -> None:
    """The VM's readiness responder (`relay ready`), as scheduled-events-relay-ready.service
    runs it: `/readyz` at `where` from the drain file its relay publishes; it answers 200
    whenever the relay is not running (it fails open), so a relay restart, upgrade or crash
    takes no VM out of its load balancer."""
    state = demo.workdir / "relays" / vm
    state.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "relay",
        "ready",
        f"--listen={where}",
        f"--drain-file={drain_file(demo, vm)}",
        f"--ready-status={state / 'ready-status.json'}",
    ]
    log = demo.workdir / "logs" / f"responder-{vm}.log"
    proc = demo.stack.process(argv, log, env=relay_env(demo.options.env))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DemoAborted(f"readiness responder of {vm} exited: {log.read_text()[-400:]}")
        with contextlib.suppress(requests.RequestException):
            requests.get(f"http://{where}/readyz", timeout=1)
            return
        time.sleep(0.1)
    raise DemoAborted(f"readiness responder of {vm} did not answer at {where} in 20 s")


def start_hook_unit(demo: DemoState, hooks: dict[str, Path]) -> Path:
    """The hook unit's stand-in (local/hook_unit.py) as a process of the stack, listening
    once this returns: its socket."""
    path = hook_socket_path(demo.workdir / "relays")
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "local.hook_unit",
        str(path),
        json.dumps({k: str(v) for k, v in hooks.items()}),
        str(HOOK_TIMEOUT),
    ]
    proc = demo.stack.process(
        argv, demo.workdir / "logs" / "hook-unit.log", env=relay_env(demo.options.env)
    )
    deadline = time.monotonic() + 20
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise DemoAborted(f"the hook unit's stand-in did not listen at {path}")
        time.sleep(0.05)
    return path


def wait_healthy(demo: DemoState, vm: str, url: str, timeout: float = 20.0) -> None:
    """Until the relay answers its health check; its log's tail if it exited instead."""
    deadline = time.monotonic() + timeout
    proc = demo.relays[vm]
    while time.monotonic() < deadline:
        demo.check_deadline()
        if proc.poll() is not None:
            log = (demo.workdir / "logs" / f"relay-{vm}.log").read_text(errors="replace")
            raise DemoAborted(f"relay of {vm} exited ({proc.returncode}): {log[-400:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/v1/health", timeout=1).status_code < 500:
                return
        time.sleep(0.1)
    raise DemoAborted(f"relay of {vm} did not answer on {url}/v1/health in {timeout:.0f} s")
