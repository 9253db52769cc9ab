"""Heartbeats as relays send them now: real relay processes writing into the liveness table.

Each relay (the shipped pyz where one is built, else `python -m relay`; see set_relays)
polls its own VM on the simulator and writes a signed heartbeat every second straight into
the `{prefix}liveness` table on Azurite (contract §5: untrusted hints, never the app's VM
table), through a counting proxy (tests.bench.wire), with a SAS of add + update on that
table only, as the relay identity's role allows in Azure. What the model reads: Table
requests and entities per heartbeat, counted on the wire against the heartbeats the relays
say they wrote, once each relay's first document is acknowledged as the app does (its
pending row deleted, contract §11); no Service Bus message and no Functions execution is
involved at all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench.set_relays import ROOT, relay_command

PREFIX = "benchhb"


def _written(log: Path) -> int:
    """Heartbeats a relay's JSON log says it wrote."""
    count = 0
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == "forwarded" and entry.get("kind") == "heartbeat":
            count += 1
    return count


def _acknowledge(store: Any, folders: list[Path]) -> None:
    """What ingest does for each document (functions/pipeline/acknowledge.py)."""
    from functions.store.acks import acknowledge

    for folder in folders:
        for path in sorted(folder.glob("*-document.json")):
            document = json.loads(path.read_text())
            secret = bytes.fromhex(document["callback_key"]["secret"])
            acknowledge(store.liveness.table, secret, document.get("acks") or [])


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def run(connection_string: str, relays: int = 8, seconds: float = 8.0) -> dict[str, Any]:
    from functions.store.state import Store
    from local.azurite import table_sas, table_url
    from simulator import Simulator, SimulatorServer
    from tests.bench.wire import WireCounter

    store = Store.from_connection_string(connection_string, PREFIX).ensure_tables()
    sim = Simulator(time_scale=1.0)
    names = [f"hb-vm-{i:02d}" for i in range(relays)]
    for name in names:
        sim.add_vm(name)
    server = SimulatorServer(sim, host="127.0.0.1", port=0).start()
    work = Path(tempfile.mkdtemp(prefix="relay-heartbeats-"))
    sas = work / "table.sas"
    sas.write_text(table_sas(f"{PREFIX}liveness") + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env["PYTHONPATH"] = str(ROOT)
    procs: list[subprocess.Popen[bytes]] = []
    logs = [work / f"{name}.log" for name in names]
    try:
        with WireCounter(connection_string) as wire:
            url = table_url(wire.connection_string, f"{PREFIX}liveness")
            for name, log in zip(names, logs, strict=True):
                with open(log, "wb") as err:
                    procs.append(
                        subprocess.Popen(
                            [
                                *relay_command(),
                                f"--imds-url={server.vm_url(name)}",
                                f"--vm-name={name}",
                                f"--state-dir={work / name}",
                                f"--forward=file:{work / name / 'forward'}",
                                f"--heartbeat-table={url}",
                                f"--heartbeat-table-sas-file={sas}",
                                "--heartbeat-interval=1",
                                "--log-format=json",
                            ],
                            cwd=ROOT,
                            env=env,
                            stdout=subprocess.DEVNULL,
                            stderr=err,
                        )
                    )
            deadline = time.monotonic() + 30
            while not all(_written(log) for log in logs):  # every relay is up and writing
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError("relays did not write their first heartbeat")
                time.sleep(0.1)
            # The app's part: each relay's first document acknowledged (contract §11), so
            # its pending row is gone and the heartbeats measured are the steady ones.
            _acknowledge(store, [work / name / "forward" for name in names])
            time.sleep(2.5)  # two heartbeats: each relay's last probe of its row is made
            requests0, entities0 = wire.total(), wire.entities()
            beats0 = sum(_written(log) for log in logs)
            time.sleep(seconds)
            _stop(procs)  # every request made is logged by now: the two counts are exact
            requests, entities = wire.total() - requests0, wire.entities() - entities0
            beats = sum(_written(log) for log in logs) - beats0
    finally:
        _stop(procs)
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    if beats <= 0:
        raise RuntimeError("no heartbeat was written while measuring")
    return {
        "table_requests_per_relay_heartbeat": round(requests / beats, 3),
        "relay_heartbeats_measured": beats,
        "_counts": {
            "table_requests_per_relay_heartbeat": requests / beats,
            "table_entities_per_relay_heartbeat": entities / beats,
        },
    }
