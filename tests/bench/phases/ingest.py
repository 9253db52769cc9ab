"""Phase `ingest`: documents through ingest with state on Azurite, 2 worker processes x 2
sessions, the machine to itself (`ingest_docs_per_s`)."""

from __future__ import annotations

import multiprocessing
import random
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import LocalPublisher
from tests.bench.documents import envelope, reboot
from tests.bench.documents import pipeline as make_pipeline
from tests.bench.runner import Phase


def ingest_throughput(
    connection_string: str, vms: int, processes: int, threads: int
) -> dict[str, Any]:
    """Each VM's life through a maintenance: nothing, Scheduled, Started, gone (4 documents),
    10 VMs per availability set sharing the event. Sessions are spread over worker processes
    (FUNCTIONS_WORKER_PROCESS_COUNT) and threads (concurrent session invocations), and one
    VM's documents stay in order, as Service Bus sessions guarantee. The documents come in
    rounds (every VM's first, then every VM's second, ...): IMDS shows an event shared by a
    set, atomic for all its VMs (SPEC.md), to all of them in the same poll, and ends it for
    all together. Played one whole session after another instead, each VM would meet the
    event only after the VMs before it had seen it end, and reopen it for itself (per-VM
    ends, issue 31): 10 decisions and ends per event, which no real set produces."""
    sessions = _maintenance_sessions(vms)
    make_pipeline(connection_string, "benchingest", None)  # tables exist before the clock starts
    # Azurite is a fresh Node process whose JIT has not seen a Table request yet; Azure
    # Table storage has no such cold start, so it serves a smaller run first (other rows).
    warm = make_pipeline(connection_string, "benchwarm", LocalPublisher())
    for bodies in _maintenance_sessions(WARMUP_VMS):
        for body in bodies:
            ingest_message(body, warm)
    worker = _ingest_worker  # spawned workers unpickle it by its module's import path
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        # The clock starts when every worker has imported and connected (a warm function
        # host), not after a guessed head start: cold imports are not ingest throughput.
        ready = manager.Barrier(processes)
        shares = [
            (connection_string, sessions[i::processes], threads, ready) for i in range(processes)
        ]
        with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
            results = list(pool.map(worker, shares, timeout=300))
    elapsed = max(finished for _, finished, _ in results) - min(began for began, _, _ in results)
    outcomes = [outcome for _, _, worker_outcomes in results for outcome in worker_outcomes]
    if outcomes.count("processed") != len(outcomes):
        raise RuntimeError(f"not every document was processed: {sorted(set(outcomes))}")
    return {
        "ingest_docs_per_s": round(len(outcomes) / elapsed, 1),
        "ingest_docs": len(outcomes),
        "ingest_workers": f"{processes} processes x {threads} threads",
    }


WARMUP_VMS = 40  # documents through ingest before the clock starts: 4 per VM


def _maintenance_sessions(vms: int) -> list[list[str]]:
    """Each VM's documents (its Service Bus session), sessions in a random order."""
    sessions: list[list[str]] = []
    run_id = uuid.uuid4().hex[:6]
    for group in range(vms // 10):
        names = [f"ing{run_id}-{group}-{i}" for i in range(10)]
        event_id = str(uuid.uuid4()).upper()
        aset = f"as{run_id}{group}"
        for name in names:
            sessions.append(
                [
                    envelope(name, 1, [], aset),
                    envelope(name, 2, [reboot(event_id, names, "Scheduled")], aset),
                    envelope(name, 3, [reboot(event_id, names, "Started")], aset),
                    envelope(name, 4, [], aset),
                ]
            )
    random.Random(3).shuffle(sessions)
    return sessions


def _ingest_worker(args: tuple[str, list[list[str]], int, Any]) -> tuple[float, float, list[str]]:
    from tests.bench.attested import learn

    connection_string, sessions, threads, ready = args
    # What Resource Graph says of these VMs (the parent made and attested their messages).
    learn(body for bodies in sessions for body in bodies)
    # A warm worker, as a function host that has handled messages before: the first
    # documents build validators and fill connection pools (on rows of their own).
    warm = make_pipeline(connection_string, "benchwarm", LocalPublisher())
    for bodies in _maintenance_sessions(10):
        for body in bodies:
            ingest_message(body, warm)
    pipeline = make_pipeline(connection_string, "benchingest", LocalPublisher())
    outcomes: list[str] = []

    def run_document(body: str) -> None:
        outcomes.append(ingest_message(body, pipeline).outcome)

    ready.wait(timeout=120)
    began = time.time()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for round_ in range(max(len(bodies) for bodies in sessions)):
            # Every VM's document of this round, then (all workers) the next round: one
            # VM's documents stay in order, as its session keeps them.
            list(pool.map(run_document, [b[round_] for b in sessions if round_ < len(b)]))
            ready.wait(timeout=120)
    return began, time.time(), outcomes


PHASE = Phase(
    "ingest",
    lambda a: f"ingest: {a.ingest_vms * 4} documents on Azurite",
    lambda b: ingest_throughput(
        b.azurite("state"), b.args.ingest_vms, b.args.ingest_processes, b.args.ingest_threads
    ),
    azurite="state",
    targets={"ingest_docs_per_s": (">=", 200)},
    # Issue 11's throughput first, with the machine to itself (the phases beside the others
    # start after it).
    alone=True,
)
