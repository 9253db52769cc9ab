"""Documents per event: real relays, one per VM of an availability set, over the simulator.

One event naming one VM goes through Scheduled, Started and gone. Every relay of the set
sees it (IMDS shows a VM its set-mates' events), so what each relay forwards because of it
is what issue 11 counts: 3 from the named VM when relays forward only their own events,
3 from every VM of the set when they forward whole documents.

Each relay is a real relay process (the pyz where one is built, else `python -m relay`;
1 s polling, `--forward file:DIR`, its own
directory); only `*-document.json` files in that directory count (heartbeats are not
documents, and go elsewhere). A step is over when every VM's IMDS was polled twice after
the change and no forward directory has changed for half a second, so nothing is missed
and nothing is waited for by guess.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]


PYZ_CANDIDATES = ("dist/scheduled-events-relay.pyz", "infra/relay/scheduled-events-relay.pyz")


def relay_command() -> list[str]:
    """The relay as it ships where there is a build (the zipapp `make relay` writes, or the
    one committed for cloud-init), else the package: `python -m relay`."""
    for candidate in PYZ_CANDIDATES:
        if (ROOT / candidate).is_file():
            return [sys.executable, str(ROOT / candidate)]
    return [sys.executable, "-m", "relay"]


class SetResult(BaseModel):
    named: str
    per_vm: dict[str, int]  # documents forwarded because of the event, per VM
    contents: dict[str, list[list[str]]]  # per VM: the EventStatus list of each document

    @property
    def total(self) -> int:
        return sum(self.per_vm.values())

    @property
    def per_setmate(self) -> float:
        others = [n for vm, n in self.per_vm.items() if vm != self.named]
        return sum(others) / len(others) if others else 0.0


def documents(directory: Path) -> list[Path]:
    if not directory.exists():
        return []
    return sorted(p for p in directory.glob("*-document.json") if not p.name.startswith("."))


def _statuses(path: Path, event_id: str) -> list[str]:
    import json

    data = json.loads(path.read_bytes())
    if isinstance(data, dict) and "body" in data and "kind" not in data:  # a wrapped message
        data = json.loads(data["body"]) if isinstance(data["body"], str) else data["body"]
    document = data.get("document") if isinstance(data, dict) else None
    events = (document or {}).get("Events") or []
    return [e.get("EventStatus", "") for e in events if e.get("EventId") == event_id]


def run(vms: int = 20, poll: float = 1.0, timeout: float = 90.0) -> SetResult:
    from simulator import Simulator, SimulatorServer

    sim = Simulator(time_scale=1.0)
    names = [f"set-vm-{i:02d}" for i in range(vms)]
    sim.add_availability_set("benchset", names)
    server = SimulatorServer(sim, host="127.0.0.1", port=0).start()
    work = Path(tempfile.mkdtemp(prefix="set-relays-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env["PYTHONPATH"] = str(ROOT)
    relays: list[subprocess.Popen[bytes]] = []
    outs = {name: work / name / "forward" for name in names}
    try:
        for name in names:
            relays.append(
                subprocess.Popen(
                    [
                        *relay_command(),
                        f"--imds-url={server.vm_url(name)}",
                        f"--vm-name={name}",
                        "--availability-set=benchset",
                        f"--state-dir={work / name / 'state'}",
                        f"--forward=file:{outs[name]}",
                        f"--poll-interval={poll:g}",
                        "--heartbeat-interval=86400",
                        "--log-format=text",
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + timeout
        while not all(documents(out) for out in outs.values()):
            dead = [r.args for r in relays if r.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"relays did not forward their first document (exited: {dead})")
            time.sleep(0.1)
        _settle(sim, names, outs, deadline)
        before = {name: len(documents(out)) for name, out in outs.items()}
        event_id = sim.add_event("Reboot", resources=[names[0]], notice=3600)
        _settle(sim, names, outs, deadline)
        sim.start_event(event_id)
        _settle(sim, names, outs, deadline)
        sim.remove_event(event_id)
        _settle(sim, names, outs, deadline)
        per_vm = {name: len(documents(out)) - before[name] for name, out in outs.items()}
        contents = {
            name: [_statuses(p, event_id) for p in documents(out)[before[name] :]]
            for name, out in outs.items()
        }
    finally:
        for relay in relays:
            relay.terminate()
        for relay in relays:
            try:
                relay.wait(10)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait(10)
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return SetResult(named=names[0], per_vm=per_vm, contents=contents)


def _settle(sim, names: list[str], outs: dict[str, Path], deadline: float) -> None:  # type: ignore[no-untyped-def]
    """Every relay polled twice since now, then no forward directory changed for 0.5 s."""
    start = {name: sim.request_count(name) for name in names}
    while any(sim.request_count(n) < start[n] + 2 for n in names):
        if time.monotonic() > deadline:
            raise RuntimeError("the relays stopped polling")
        time.sleep(0.05)
    seen = {name: len(documents(out)) for name, out in outs.items()}
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < 0.5:
        time.sleep(0.1)
        now = {name: len(documents(out)) for name, out in outs.items()}
        if now != seen:
            seen, quiet_since = now, time.monotonic()
        if time.monotonic() > deadline:
            raise RuntimeError("the relays kept forwarding")
