"""Heartbeats on their own queue (contract C1): a batch is one execution, its liveness
writes are merges grouped per VM partition (no read), silence and recovery keep working,
and the local host batches exactly as the function app's trigger configuration says."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from functions.pipeline.heartbeats import ingest_heartbeats
from functions.pipeline.ingest import ingest_message
from functions.pipeline.watchdog import run_watchdog
from functions.store.keys import VM_BUCKETS
from local.host import HOST_JSON, LocalHost, TriggerConfig
from tests.functions.conftest import envelope, event, make_pipeline, write_liveness
from tests.functions.test_entrypoints import FUNCTIONS
from tests.tablecount import TableCounter


def beat(vm: str, sequence: int, clock, callback_url: str | None = None) -> str:
    return envelope(
        vm, sequence, None, kind="heartbeat", observed_at=clock.now(), callback_url=callback_url
    )


def test_a_batch_of_heartbeats_costs_one_merge_per_vm_partition_and_no_read(azurite, store, clock):
    with TableCounter(azurite) as counter:
        from functions.store.state import Store

        counted = Store.from_connection_string(counter.connection_string, store.prefix)
        pipeline, _ = make_pipeline(counted, clock)
        urls = [f"http://10.0.0.{i % 250}:8080" for i in range(200)]
        # Each VM's first message enrolls it (its identities row: once per VM, then once per
        # VM_FACTS_MAX_AGE_SECONDS); the steady state is what a batch costs after that.
        ingest_heartbeats([beat(f"vm-{i:03d}", 1, clock, urls[i]) for i in range(200)], pipeline)
        clock.advance(60)
        bodies = [beat(f"vm-{i:03d}", 2, clock, urls[i]) for i in range(200)]
        counter.reset()
        result = ingest_heartbeats(bodies, pipeline)
        kinds = counter.by_kind()
    assert result.heard == 200 and result.rejected == 0
    # 200 VMs over VM_BUCKETS partitions: two transactions of at most 100 per partition
    assert kinds == {"batch": result.requests} and result.requests <= 2 * VM_BUCKETS
    vm = store.get_vm("vm-007")
    assert vm.last_seen == clock.now() and vm.callback_url == "http://10.0.0.7:8080"


def test_a_heartbeat_never_overwrites_what_a_document_wrote(store, clock):
    pipeline, _ = make_pipeline(store, clock)
    ingest_message(envelope("vm1", 5, [event("EV-H")], scale_set="web"), pipeline)
    clock.advance(300)
    ingest_heartbeats([beat("vm1", 6, clock)], pipeline)
    vm = store.get_vm("vm1")
    assert vm.last_seen == clock.now()
    assert (vm.last_sequence, vm.scale_set, vm.event_ids) == (5, "web", ["EV-H"])
    # The next document still sees its own state (and is not stale).
    clock.advance(1)
    assert ingest_message(envelope("vm1", 7, []), pipeline).outcome == "processed"


def test_bad_messages_are_rejected_and_documents_on_this_queue_are_ingested(store, clock):
    pipeline, publisher = make_pipeline(store, clock)
    result = ingest_heartbeats(
        [
            b"not json",
            envelope("vm2", 1, [event("EV-D", resources=("vm2",))]),
            beat("vm3", 1, clock),
        ],
        pipeline,
        ["m1", "m2", "m3"],
    )
    assert (result.rejected, result.documents, result.heard) == (1, 1, 1)
    (row,) = list(store.rejected_rows())
    assert row["message_id"] == "m1" and row["reason"]
    assert publisher.transitions("EV-D") == ["scheduled", "decided"]


def test_silence_and_recovery_through_heartbeats_only(store, clock):
    """Silence comes from the relays' liveness rows (contract §5); a Service Bus heartbeat
    (the old path) still counts as heard, so it ends a silence too."""
    pipeline, publisher = make_pipeline(store, clock)
    for name in ("vm1", "vm2", "vm3"):
        ingest_message(envelope(name, 1, []), pipeline)
        write_liveness(store, name, clock.now())
    clock.advance(5 * 60)
    write_liveness(store, "vm2", clock.now())
    write_liveness(store, "vm3", clock.now())
    clock.advance(6 * 60)  # vm1 last heard 11 min ago, vm2 and vm3 6 min ago
    report = run_watchdog(pipeline)
    assert report.silent == ["vm1"] and report.skipped_rows == 0
    assert run_watchdog(pipeline).silent == []  # once per silence
    clock.advance(60)
    write_liveness(store, "vm1", clock.now())  # a relay's merge: the watchdog sees it
    report = run_watchdog(pipeline)
    assert report.recovered == ["vm1"]
    assert [n.transition for n in publisher.published] == ["relay_silent", "relay_recovered"]
    assert run_watchdog(pipeline).recovered == []  # once
    vm = store.get_vm("vm1")
    assert vm.silent_announced_for is None and vm.recovery_pending is None
    # vm3's liveness row goes stale, but it was heard through a Service Bus heartbeat
    # (a blind merge into its VM row): not silent.
    clock.advance(11 * 60)
    write_liveness(store, "vm1", clock.now())
    write_liveness(store, "vm2", clock.now())
    ingest_heartbeats([beat("vm3", 2, clock)], pipeline)
    assert run_watchdog(pipeline).silent == []
    clock.advance(11 * 60)
    write_liveness(store, "vm1", clock.now())
    write_liveness(store, "vm2", clock.now())
    assert run_watchdog(pipeline).silent == ["vm3"]


# ------------------------------------------------------------------ local host ↔ triggers


def test_the_local_host_uses_the_trigger_configuration_of_the_function_app():
    host_json = json.loads(HOST_JSON.read_text())["extensions"]["serviceBus"]
    config = TriggerConfig.from_host_json()
    assert config.max_concurrent_sessions == host_json["maxConcurrentSessions"]
    assert config.max_message_batch_size == host_json["maxMessageBatchSize"]
    assert config.min_message_batch_size == host_json["minMessageBatchSize"]
    hours, minutes, seconds = host_json["maxBatchWaitTime"].split(":")
    assert config.max_batch_wait_seconds == int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    # The decorators: documents are sessions (one VM in order), heartbeats come in batches.
    ingest = FUNCTIONS["ingest"].get_bindings()[0].get_dict_repr()
    heartbeats = FUNCTIONS["heartbeats"].get_bindings()[0].get_dict_repr()
    assert ingest["isSessionsEnabled"] is True and ingest.get("cardinality") in (None, "one")
    assert heartbeats["queueName"] == "%HEARTBEATS_QUEUE%"
    assert str(heartbeats["cardinality"].value) == "many"
    assert not heartbeats.get("isSessionsEnabled")


def _write(folder: Path, name: str, text: str, age: float = 0.0) -> None:
    path = folder / name
    path.write_text(text)
    if age:
        stamp = time.time() - age
        os.utime(path, (stamp, stamp))


def test_the_local_host_batches_heartbeats_as_configured(tmp_path, store, clock):
    pipeline, publisher = make_pipeline(store, clock)
    config = TriggerConfig(
        max_message_batch_size=3, min_message_batch_size=2, max_batch_wait_seconds=30
    )
    host = LocalHost(
        tmp_path,
        pipeline.settings,
        store,
        publisher,
        clock=clock,
        triggers=config,
        admission=pipeline.admission,
    )
    for i in range(7):
        _write(host.heartbeats_dir, f"{i:04d}.json", beat(f"vm{i}", 1, clock))
    # 3 + 3 full batches; the last (1 < minMessageBatchSize) waits for maxBatchWaitTime.
    report = host.run_once()
    assert [b.heard for b in report.heartbeat_batches] == [3, 3]
    assert [p.name for p in host.pending(host.heartbeats_dir)] == ["0006.json"]
    _write(host.heartbeats_dir, "0006.json", beat("vm6", 1, clock), age=31)
    assert [b.heard for b in host.run_once().heartbeat_batches] == [1]
    assert store.get_vm("vm6").last_seen == clock.now()


def test_the_local_host_keeps_each_vms_documents_in_order_across_concurrent_sessions(
    tmp_path, store, clock
):
    pipeline, publisher = make_pipeline(store, clock)
    config = TriggerConfig(max_concurrent_sessions=4)
    host = LocalHost(
        tmp_path,
        pipeline.settings,
        store,
        publisher,
        clock=clock,
        triggers=config,
        admission=pipeline.admission,
    )
    n = 0
    for seq in range(1, 4):
        for vm in range(6):
            events = [event(f"EV-{vm}", resources=(f"vm{vm}",))] if seq < 3 else []
            _write(tmp_path, f"{n:04d}.json", envelope(f"vm{vm}", seq, events))
            n += 1
    report = host.run_once()
    assert report.processed == 18 and report.stale == 0
    for vm in range(6):
        assert publisher.transitions(f"EV-{vm}") == ["scheduled", "decided", "cancelled"]
