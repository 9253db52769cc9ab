"""Relay messages for the bench, attested as relays send them (per-VM identity, issue 22).

The bench builds envelopes by hand; the app admits a relay message only with an IMDS
attested document for its exact bytes and Azure's facts for the vmId it names
(functions.pipeline.admission). tests.identity_harness does both the way the tests do: the
simulator's test issuer signs the document, and a StaticResolver stands in for Resource
Graph, answering with the VM's name and sets (here: the sets the envelope claims).

Spawned worker processes have their own (empty) resolver: they `learn` the facts of the
messages they are handed before they process them (not timed, not counted), so only what
the app itself does per message is measured: one RSA verify and, per message, one read of
the identities table (plus one write the first time a VM is heard). They also need the
issuer that signed those messages: the first `attested` call saves this process's issuer to
a folder named by SIMULATOR_CA_DIR, which spawned workers inherit and load it from.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from simulator import identity as azure
from tests import identity_harness as harness


def share_issuer() -> None:
    """This process's simulator issuer, saved where processes spawned from now on load it
    (SIMULATOR_CA_DIR): what the parent signs, the workers' admission trusts."""
    if os.environ.get("SIMULATOR_CA_DIR"):
        return
    folder = Path(tempfile.mkdtemp(prefix="bench-simulator-ca-"))
    azure.save_issuer(azure.test_issuer(), folder)
    os.environ["SIMULATOR_CA_DIR"] = str(folder)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


def attested(body: str) -> str:
    """`body` (an envelope's JSON, vm claims included) with vm_id, callback_key and an
    attested document; Azure's facts for its VM are registered (its claimed sets)."""
    share_issuer()
    data = json.loads(body)
    vm = data["vm"]
    signed = harness.signed_envelope(
        data,
        datetime.fromisoformat(data["observed_at"]),
        availability_set=vm.get("availability_set"),
        scale_set=vm.get("scale_set"),
    )
    harness.RESOLVER.register(_facts(vm))  # fetched now, not when the message was observed
    return signed


def learn(bodies: Iterable[str]) -> None:
    """Register Azure's facts for the VMs of `bodies` (made by `attested` in another
    process): what Resource Graph would answer this process's resolver."""
    seen: set[str] = set()
    for body in bodies:
        vm = json.loads(body)["vm"]
        if vm["name"] not in seen:
            seen.add(vm["name"])
            harness.RESOLVER.register(_facts(vm))


def _facts(vm: dict[str, Any]) -> Any:
    # Fetched "now" (wall clock): fresh for every pipeline clock the bench uses, so the
    # admission reads the identities table and never asks the resolver again.
    return harness.facts_for(
        vm["name"],
        availability_set=vm.get("availability_set"),
        scale_set=vm.get("scale_set"),
        fetched_at=datetime.now(UTC),
    )


def admission(store: Any) -> Any:
    """The app's admission step, trusting the simulator's issuer (tests.identity_harness)."""
    return harness.admission(store)


APP_SECRET = harness.APP_SECRET.decode()
