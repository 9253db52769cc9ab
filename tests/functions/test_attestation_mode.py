"""ATTESTATION_MODE: enforce (default) rejects a document that fails; report admits it as the
vmId it claims, says so and counts it, and enforces everything else.

The failing document here is self-signed in the simulator's shape (a root of its own, not
the one the app trusts): the chain check fails, nothing else does.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest

from functions import telemetry
from functions.identity.attestation import AttestationUnavailable
from functions.identity.facts import FactsUnavailable
from functions.pipeline.admission import REPORT
from functions.pipeline.admission_tally import AdmissionTally, read_report
from functions.pipeline.ingest import ingest_message
from functions.web.views import attestation_state
from simulator import identity as azure
from tests import identity_harness
from tests.functions.conftest import T0, envelope, event, make_pipeline


def self_signed(body: str) -> str:
    """The same message, its attested document signed by a CA the app does not trust."""
    data = json.loads(body)
    nonce = data["attestation"]["nonce"]
    content = azure.attested_content(
        data["vm"]["vm_id"],
        identity_harness.SUBSCRIPTION,
        nonce,
        now=T0 - timedelta(days=1),
        lifetime=timedelta(days=3650),
    )
    forger = azure.new_issuer()
    data["attestation"]["signature"] = azure.sign(content, forger.leaf, forger.leaf_key)
    return json.dumps(data)


def reporting(store, clock):
    pipeline, publisher = make_pipeline(store, clock, attestation_mode=REPORT)
    pipeline.admission.mode = pipeline.settings.attestation_mode
    pipeline.admission.tally = AdmissionTally(table=store.events)
    return pipeline, publisher


def test_enforce_is_the_default_and_rejects_a_self_signed_document(store, clock):
    pipeline, _ = make_pipeline(store, clock)
    assert pipeline.settings.attestation_mode == "enforce"
    body = self_signed(envelope("vm-forged", 1, [event("EV-F", resources=("vm-forged",))]))
    result = ingest_message(body, pipeline)
    assert result.outcome == "rejected"
    assert "does not chain to a trusted root" in result.reason
    assert store.get_event("EV-F") is None
    assert attestation_state(pipeline) is None  # nothing to warn about


def test_report_admits_an_enrolled_vm_by_its_key_logs_the_check_and_counts_it(store, clock, caplog):
    """A mismatch with Azure after a VM enrolled (a chain not shipped, say): the VM's
    messages fail the check but carry the key its attested message gave, so report mode
    admits them as that VM, says so and counts them."""
    caplog.set_level(logging.INFO)
    pipeline, _ = reporting(store, clock)
    assert ingest_message(envelope("vm-forged", 1, [], observed_at=T0), pipeline).outcome != (
        "rejected"
    )
    body = self_signed(envelope("vm-forged", 2, [event("EV-F", resources=("vm-forged",))]))
    result = ingest_message(body, pipeline)
    assert result.outcome != "rejected", result.reason
    record = store.get_event("EV-F")
    assert record is not None and list(record.resources) == ["vm-forged"]
    # Admitted as Azure's facts for the vmId it claims (Resource Graph's name, its key).
    identity = pipeline.admission.registry.get(identity_harness.vm_id("vm-forged"))
    assert identity is not None and identity.facts.name == "vm-forged"
    warning = next(r for r in caplog.records if "would reject" in r.getMessage())
    assert warning.levelno == logging.WARNING
    assert "'chain'" in warning.getMessage()
    assert "does not chain to a trusted root" in warning.getMessage()
    assert any("admitted by its enrolled callback key" in r.getMessage() for r in caplog.records)
    # Counted: the `admission` log lines and the row the fleet page reads.
    clock.advance(61)
    pipeline.admission.tally.flush(clock.now())
    lines = [
        json.loads(r.getMessage()[len(telemetry.PREFIX) :])
        for r in caplog.records
        if r.getMessage().startswith(telemetry.PREFIX + '{"kind":"admission"')
    ]
    assert sum(x["admitted"] for x in lines) == 2 and sum(x["unverified"] for x in lines) == 1
    assert {k: v for x in lines for k, v in x["checks"].items()} == {"chain": 1}
    report = read_report(store.events)
    assert report["total"] == 1 and report["by_check"] == {"chain": 1}
    assert report["last"]["check"] == "chain"
    assert report["last"]["vm_id"] == identity_harness.vm_id("vm-forged")
    state = attestation_state(pipeline)
    assert state["mode"] == "report" and state["unverified"]["total"] == 1


def test_report_rejects_a_failed_document_of_a_vm_never_enrolled_and_counts_it(
    store, clock, caplog
):
    caplog.set_level(logging.INFO)
    pipeline, _ = reporting(store, clock)
    body = self_signed(envelope("vm-first", 1, [event("EV-N", resources=("vm-first",))]))
    result = ingest_message(body, pipeline)
    assert result.outcome == "rejected"
    assert "does not chain to a trusted root" in result.reason
    assert "no callback key from an attested message" in result.reason
    assert store.get_event("EV-N") is None
    assert pipeline.admission.registry.get(identity_harness.vm_id("vm-first")) is None
    assert any("would reject" in r.getMessage() for r in caplog.records)
    assert read_report(store.events)["by_check"] == {"chain": 1}


def test_report_counts_add_up_across_flushes_and_hosts(store, clock):
    first, _ = reporting(store, clock)
    second, _ = reporting(store, clock)
    for n, pipeline in enumerate((first, second, first)):
        clock.advance(61)
        body = self_signed(envelope(f"vm-r{n}", 1, [], observed_at=clock.now()))
        assert ingest_message(body, pipeline).outcome == "rejected"  # never enrolled
    assert read_report(store.events)["by_check"] == {"chain": 3}


def test_report_spends_no_query_and_no_wait_on_a_vm_resource_graph_does_not_know(store, clock):
    """Issue 32: a claimed vmId (random, or one Resource Graph does not show yet) whose
    document failed is rejected at once: no Resource Graph query, no 15 s wait."""
    pipeline, _ = reporting(store, clock)
    waits: list[float] = []
    pipeline.admission.sleep = waits.append
    asked: list[str] = []
    upstream = pipeline.admission.identities.upstream
    original = upstream.resolve
    upstream.resolve = lambda vm_id: asked.append(vm_id) or original(vm_id)
    try:
        body = self_signed(envelope("vm-ghost", 1, [], observed_at=T0))
        identity_harness.RESOLVER._facts.pop(identity_harness.vm_id("vm-ghost"), None)
        result = ingest_message(body, pipeline)
    finally:
        upstream.resolve = original
    assert result.outcome == "rejected"
    assert waits == [] and asked == []
    assert pipeline.admission.registry.get(identity_harness.vm_id("vm-ghost")) is None


def test_report_still_enforces_the_other_checks(store, clock):
    pipeline, _ = reporting(store, clock)
    data = json.loads(envelope("vm-nokey", 1, []))
    del data["callback_key"]
    result = ingest_message(self_signed(json.dumps(data)), pipeline)
    assert result.outcome == "rejected" and "callback_key is missing" in result.reason
    data = json.loads(envelope("vm-noatt", 1, []))
    del data["attestation"]
    result = ingest_message(json.dumps(data), pipeline)
    assert result.outcome == "rejected" and "attestation: missing" in result.reason


@pytest.mark.parametrize("mode", ["enforce", "report"])
def test_an_attestation_that_cannot_be_checked_now_is_retried_never_rejected(store, clock, mode):
    pipeline, _ = make_pipeline(store, clock)
    pipeline.admission.mode = mode

    class Unreachable:
        def verify(self, body, now):
            raise AttestationUnavailable("intermediate not fetched: timed out")

    pipeline.admission.verifier = Unreachable()
    body = envelope("vm-blip", 1, [event("EV-B", resources=("vm-blip",))])
    with pytest.raises(FactsUnavailable, match="cannot be checked now"):
        ingest_message(body, pipeline)  # abandoned: Service Bus delivers it again
    assert list(store.rejected_rows()) == []
    assert store.get_event("EV-B") is None


def test_the_rejection_line_counts_rejections_once_a_minute(store, clock, caplog):
    caplog.set_level(logging.INFO, logger="sebridge.telemetry")
    pipeline, _ = make_pipeline(store, clock)
    good = envelope("vm-good", 1, [])
    ingest_message(good, pipeline)  # the first judgement writes a line at once
    for n in range(3):
        ingest_message(self_signed(envelope(f"vm-bad{n}", 1, [])), pipeline)
    clock.advance(60)
    ingest_message(envelope("vm-good", 2, []), pipeline)
    lines = [
        json.loads(r.getMessage()[len(telemetry.PREFIX) :])
        for r in caplog.records
        if r.getMessage().startswith(telemetry.PREFIX + '{"kind":"admission"')
    ]
    assert [(x["admitted"], x["rejected"]) for x in lines] == [(1, 0), (1, 3)]


def test_the_fleet_page_and_policy_check_warn_that_the_bridge_is_not_enforcing(
    store, clock, monkeypatch, capsys
):
    from functions.__main__ import main
    from functions.web.pages import attestation_warning

    pipeline, _ = reporting(store, clock)
    assert "NOT ENFORCED" in attestation_warning(attestation_state(pipeline))
    assert "0 such message(s)" in attestation_warning(attestation_state(pipeline))
    ingest_message(self_signed(envelope("vm-page", 1, [])), pipeline)
    shown = attestation_warning(attestation_state(pipeline))
    assert "1 such message(s) failed (chain: 1)" in shown and "check chain" in shown
    enforcing, _ = make_pipeline(store, clock)
    assert attestation_warning(attestation_state(enforcing)) == ""

    monkeypatch.setenv("ATTESTATION_MODE", "report")
    assert main(["policy", "check"]) == 0
    assert "NOT ENFORCING" in capsys.readouterr().err
    monkeypatch.setenv("ATTESTATION_MODE", "enforce")
    assert main(["policy", "check"]) == 0
    assert "NOT ENFORCING" not in capsys.readouterr().err


def test_report_never_lets_an_unverified_message_replace_an_enrolled_vms_key(store, clock):
    """A VM claiming another's vmId (report mode admits claims) cannot move the callbacks
    meant for that VM to a key of its own: the key its attested messages gave stays."""
    pipeline, _ = reporting(store, clock)
    genuine = envelope("vm-victim", 1, [], observed_at=T0)
    assert ingest_message(genuine, pipeline).outcome != "rejected"
    vm_id = identity_harness.vm_id("vm-victim")
    before = pipeline.admission.registry.get(vm_id).keys
    thief = identity_harness.callback_key("vm-victim", "http://10.9.9.9:8492")
    forged = self_signed(envelope("vm-victim", 2, [], observed_at=T0, key=thief))
    result = ingest_message(forged, pipeline)
    assert result.outcome == "rejected" and "not the VM's key" in result.reason
    after = pipeline.admission.registry.get(vm_id).keys
    assert after == before and thief.key_id not in {k.key_id for k in after}


def test_report_never_enrols_a_vm_first_seen_unverified(store, clock):
    """Issue 32: a key an unverified message brings is never stored, so no VM can plant
    its key for a VM that has not sent yet."""
    pipeline, _ = reporting(store, clock)
    body = self_signed(envelope("vm-newcomer", 1, [], observed_at=T0))
    assert ingest_message(body, pipeline).outcome == "rejected"
    assert pipeline.admission.registry.get(identity_harness.vm_id("vm-newcomer")) is None


def test_the_watchdog_sends_the_counts_of_a_quiet_minute(store, clock, caplog):
    """Rejections followed by silence: the next message would flush them, but none comes;
    the watchdog (every minute) does."""
    from azure.functions.timer import TimerRequest

    from functions.triggers import core

    caplog.set_level(logging.INFO, logger="sebridge.telemetry")
    pipeline, _ = make_pipeline(store, clock)
    ingest_message(envelope("vm-ok", 1, []), pipeline)  # first judgement: a line at once
    ingest_message(self_signed(envelope("vm-bad", 1, [])), pipeline)  # held for a minute
    clock.advance(61)
    core.use_pipeline(pipeline)
    try:
        core.watchdog(TimerRequest())
    finally:
        core.use_pipeline(None)
    lines = [
        json.loads(r.getMessage()[len(telemetry.PREFIX) :])
        for r in caplog.records
        if r.getMessage().startswith(telemetry.PREFIX + '{"kind":"admission"')
    ]
    assert [(x["admitted"], x["rejected"]) for x in lines] == [(1, 0), (0, 1)]
