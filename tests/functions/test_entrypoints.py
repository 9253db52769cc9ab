"""The CLI, the Azure handlers from function_app.py, the local host, and policy loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import azure.functions as func
import pytest
from azure.functions.timer import TimerRequest

from functions.model.policy import Policy, Window, load_policy
from functions.pipeline.publish import ServiceBusPublisher, application_properties
from functions.settings import SettingsInvalid, load_settings
from functions.triggers import core as handlers
from local.host import LocalHost
from tests.functions.conftest import T0, envelope, event, make_pipeline, write_liveness
from tests.indexed_functions import indexed_functions

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("POLICY__")}
    return subprocess.run(
        [sys.executable, "-m", "functions", *args],
        cwd=ROOT,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_cli_check_prints_the_default_policy():
    done = run_cli("policy", "check")
    assert done.returncode == 0, done.stderr
    policy = json.loads(done.stdout)
    assert [r["name"] for r in policy["rules"]] == [
        "short-freeze",
        "terminate-drain",
        "drain-then-approve",
    ]


def test_cli_check_exits_2_on_an_invalid_policy():
    done = run_cli("policy", "check", env={"POLICY__RULES": '[{"name": "x", "action": "yes"}]'})
    assert done.returncode == 2
    assert "POLICY__RULES[0].action" in done.stderr
    done = run_cli("policy", "check", env={"POLICY__RULES": "[{"})
    assert done.returncode == 2 and "POLICY__RULES is not valid JSON" in done.stderr


def test_cli_explain_document_and_envelope(tmp_path):
    events = [
        event("A", "Freeze", duration=5),
        event("B", "Terminate", source="User"),
        event("C", "Reboot"),
        event("D", "Redeploy", source="User"),
    ]
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"DocumentIncarnation": 1, "Events": events}))
    done = run_cli("policy", "explain", str(doc))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(x["EventId"], x["action"], x["rule"]) for x in lines] == [
        ("A", "approve", "short-freeze"),
        ("B", "drain", "terminate-drain"),
        ("C", "drain", "drain-then-approve"),
        ("D", "drain", "drain-then-approve"),
    ]
    env_file = tmp_path / "env.json"
    env_file.write_text(envelope("vm1", 1, [event("E", "Preempt")]))
    done = run_cli("policy", "explain", str(env_file))
    line = json.loads(done.stdout)
    assert (line["action"], line["page"]) == ("drain", True)
    bad = tmp_path / "bad.json"
    bad.write_text('{"Events": 1}')
    assert run_cli("policy", "explain", str(bad)).returncode == 2


def test_policy_from_app_settings_and_fail_closed(monkeypatch):
    monkeypatch.setenv("POLICY__DRY_RUN", "true")
    monkeypatch.setenv("POLICY__MAX_CONCURRENT_PER_SET", "3")
    monkeypatch.setenv(
        "POLICY__WINDOWS", '[{"days": ["Sat", "Sun"], "start": "22:00", "end": "02:00"}]'
    )
    monkeypatch.setenv("POLICY__PAGE__EVENT_TYPES", '["Preempt"]')
    load = load_policy()
    assert load.error is None
    assert load.policy.dry_run and load.policy.max_concurrent_per_set == 3
    assert load.policy.page.event_types == ("Preempt",)
    monkeypatch.setenv("POLICY__TIMEZONE", "Nowhere/City")
    load = load_policy()
    assert load.policy is None and "POLICY__TIMEZONE" in load.error


def test_windows_across_midnight_and_dst():
    policy = Policy(
        windows=(Window(days=("Sat",), start="22:00", end="02:00"),), timezone="Europe/Oslo"
    )
    # 2026-03-28 is a Saturday; DST starts in Oslo on Sunday 2026-03-29 at 02:00.
    assert policy.in_window(datetime(2026, 3, 28, 21, 30, tzinfo=UTC))  # 22:30 local
    assert not policy.in_window(datetime(2026, 3, 28, 20, 30, tzinfo=UTC))
    opening = policy.next_window_opening(datetime(2026, 3, 28, 12, 0, tzinfo=UTC))
    assert opening == datetime(2026, 3, 28, 21, 0, tzinfo=UTC)


def test_settings_errors_are_clear(monkeypatch):
    monkeypatch.setenv("RELAY_SILENT_AFTER_SECONDS", "soon")
    with pytest.raises(SettingsInvalid, match="relay_silent_after_seconds"):
        load_settings()
    monkeypatch.delenv("RELAY_SILENT_AFTER_SECONDS")
    settings = load_settings()
    with pytest.raises(SettingsInvalid, match="StateStorage"):
        settings.table_connection()
    monkeypatch.setenv("StateStorage__accountName", "acct")
    monkeypatch.setenv(
        "ServiceBusConnection__fullyQualifiedNamespace", "sb-x.servicebus.windows.net"
    )
    settings = load_settings()
    assert settings.table_connection() == ("account", "https://acct.table.core.windows.net")
    assert settings.service_bus() == ("namespace", "sb-x.servicebus.windows.net")


def test_service_bus_publisher_sets_message_id_and_properties(store, clock, relay):
    sent = []

    class Sender:
        def send_messages(self, message):
            sent.append(message)

    pipeline, _ = make_pipeline(store, clock)
    pipeline.publisher = ServiceBusPublisher(Sender())
    from functions.pipeline.ingest import ingest_message

    ingest_message(envelope("vm1", 1, [event("EV-SB", "Preempt")]), pipeline)
    assert [m.message_id for m in sent] == ["event:EV-SB:scheduled", "event:EV-SB:decided"]
    props = sent[1].application_properties
    assert props[b"transition" if b"transition" in props else "transition"] in (
        "decided",
        b"decided",
    )
    body = json.loads(b"".join(sent[1].body))
    assert body["decision"]["page"] is True and body["transition"] == "decided"


def test_application_properties_for_filters():
    from functions.model.event import Decision, Notification, Transition

    note = Notification(
        transition=Transition.DECIDED,
        occurred_at=T0,
        decision=Decision(action="hold", rule="r", page=True, severity="error"),
    )
    assert application_properties(note)["page"] is True
    assert application_properties(note)["severity"] == "error"


# get_functions() validates names and may be called once per app (as the host does).
FUNCTIONS = {f.get_function_name(): f for f in indexed_functions()}


def _functions() -> dict[str, object]:
    return {name: f.get_user_function() for name, f in FUNCTIONS.items()}


def test_function_bindings():
    ingest = FUNCTIONS["ingest"].get_bindings()[0].get_dict_repr()
    assert ingest["type"] == "serviceBusTrigger" and ingest["isSessionsEnabled"] is True
    assert ingest["queueName"] == "%DOCUMENTS_QUEUE%"
    assert ingest["connection"] == "ServiceBusConnection"
    assert FUNCTIONS["watchdog"].get_bindings()[0].get_dict_repr()["schedule"] == "0 * * * * *"
    # The sweep's work queue (issue 37): one due event per message, no sessions.
    work = FUNCTIONS["reconcile"].get_bindings()[0].get_dict_repr()
    assert work["type"] == "serviceBusTrigger" and not work.get("isSessionsEnabled")
    assert work["queueName"] == "%RECONCILE_QUEUE%"


def test_handlers_from_function_app(store, clock, relay):
    names = _functions()
    assert set(names) == {
        "ingest",
        "heartbeats",
        "watchdog",
        "reconcile",
        "status",
        "ledger",
        "approve",
        "notify_teams",
        "notify_pagerduty",
        "notify_slack",
        "notify_webhook",
        "notify_kept",
        "terminate_drain",
        "ingest_event_grid",
        "page_event",
        "page_approve",
        "page_fleet",
        "identity_sync",
    }
    pipeline, pub = make_pipeline(store, clock)
    handlers.use_pipeline(pipeline)
    try:
        body = envelope("vm1", 1, [event("EV-HD", "Reboot")], callback_url=relay.url)
        names["ingest"](func.ServiceBusMessage(body=body.encode()))
        names["ingest"](func.ServiceBusMessage(body=b"garbage"))  # completes, recorded
        assert pub.transitions("EV-HD") == ["scheduled", "decided"]
        assert len(list(store.rejected_rows())) == 1
        clock.advance(60)
        beats = [
            func.ServiceBusMessage(
                body=envelope(vm, 2, None, kind="heartbeat", observed_at=clock.now()).encode()
            )
            for vm in ("vm1", "vm2")
        ]
        names["heartbeats"](beats)  # one execution for the batch
        assert store.get_vm("vm1").last_seen == store.get_vm("vm2").last_seen == clock.now()

        status = names["status"](func.HttpRequest("GET", "/api/status", body=b""))
        data = json.loads(status.get_body())
        assert status.status_code == 200 and data["policy"]["valid"] is True
        assert [(e["EventId"], e["decision"]["action"]) for e in data["events"]] == [
            ("EV-HD", "hold")
        ]

        # The impact ledger export: a line per reporting VM (vm1's test relay measured
        # nothing), JSON or CSV; an unknown event or format is refused with the reason.
        def ledger(event_id: str, form: str = "") -> func.HttpResponse:
            params = {"format": form} if form else {}
            url = f"/api/events/{event_id}/ledger"
            request = func.HttpRequest(
                "GET", url, body=b"", params=params, route_params={"event_id": event_id}
            )
            return names["ledger"](request)

        exported = json.loads(ledger("EV-HD").get_body())
        assert [(v["vm"], v["measured"]) for v in exported["vms"]] == [("vm1", False)]
        csv_text = ledger("EV-HD", "csv").get_body().decode()
        assert csv_text.splitlines()[0].startswith('"event_id","event_type","vm",')
        assert csv_text.splitlines()[1].startswith('"EV-HD","Reboot","vm1",')
        assert ledger("NOPE").status_code == 404
        assert ledger("EV-HD", "xml").status_code == 400

        approve = names["approve"]
        missing = approve(
            func.HttpRequest(
                "POST", "/api/events/NOPE/approve", body=b"", route_params={"event_id": "NOPE"}
            )
        )
        assert missing.status_code == 404
        ok = approve(
            func.HttpRequest(
                "POST",
                "/api/events/EV-HD/approve",
                body=b'{"by": "alice"}',
                route_params={"event_id": "EV-HD"},
            )
        )
        assert ok.status_code == 200, ok.get_body()
        assert relay.starts() == ["EV-HD"]
        assert pub.transitions("EV-HD")[-1] == "approved"
        # The caller cannot choose who approved: a function key names nobody.
        assert store.audit_rows("EV-HD")[-1]["by"] == "manual:function-key"
        answer = json.loads(ok.get_body())
        assert "ignored by" in answer["note"] and "'function-key'" in answer["note"]
        assert "alice" not in json.dumps(store.audit_rows("EV-HD"), default=str)
        approved = [n for n in pub.published if n.transition == "approved"]
        assert "alice" not in (approved[-1].detail or "")
        assert "function-key" in (approved[-1].detail or "")
        again = approve(
            func.HttpRequest(
                "POST",
                "/api/events/EV-HD/approve",
                body=b"{}",
                route_params={"event_id": "EV-HD"},
                headers={"X-MS-CLIENT-PRINCIPAL-NAME": "mallory"},
            )
        )
        assert again.status_code == 409
        assert "x-ms-client-principal-name" in json.loads(again.get_body())["note"].lower()
        assert "mallory" not in json.dumps(store.audit_rows("EV-HD"), default=str)
        listed = approve(
            func.HttpRequest(
                "POST", "/api/events/EV-HD/approve", body=b"[]", route_params={"event_id": "EV-HD"}
            )
        )
        assert listed.status_code == 400

        write_liveness(store, "vm1", clock.now())  # vm1's relay, heard once more
        clock.advance(20 * 60)
        names["watchdog"](TimerRequest())
        assert "relay_silent" in pub.transitions() or any(
            n.transition == "relay_silent" for n in pub.published
        )
        # The bulk sync needs Resource Graph; the harness's facts are static: nothing to do.
        names["identity_sync"](TimerRequest())
    finally:
        handlers.use_pipeline(None)


def test_handlers_fail_clearly_without_settings(monkeypatch):
    for key in list(os.environ):
        if key.lower().startswith(("servicebusconnection", "statestorage", "azurewebjobsstorage")):
            monkeypatch.delenv(key)
    handlers.use_pipeline(None)
    with pytest.raises(SettingsInvalid, match="StateStorage"):
        _functions()["ingest"](func.ServiceBusMessage(body=b"{}"))


def test_local_host_processes_in_order_and_dead_letters(tmp_path, store, clock, relay):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    ev = event("EV-L", source="User")
    files = [
        ("0001.json", envelope("vm1", 1, [ev], callback_url=relay.url)),
        ("0002.json", envelope("vm1", 2, [], callback_url=relay.url)),
        ("0003.json", "not json"),
        (".0004.json.tmp", "partial"),
        # vm2 reports its own event (a VM speaks only for itself: per-VM identity).
        (
            "0005.json",
            json.dumps(
                {"body": envelope("vm2", 1, [event("EV-M", resources=("vm2",))]), "message_id": "x"}
            ),
        ),
    ]
    for name, text in files:
        (inbox / name).write_text(text)
    pipeline, pub = make_pipeline(store, clock)
    host = LocalHost(
        inbox,
        pipeline.settings,
        store,
        pub,
        clock=clock,
        max_delivery_count=2,
        admission=pipeline.admission,
    )
    report = host.run_once()
    assert (report.processed, report.rejected) == (3, 1)
    assert pub.transitions("EV-L") == ["scheduled", "decided", "approved", "completed"]
    assert pub.transitions("EV-M") == ["scheduled", "decided"]
    assert sorted(p.name for p in (inbox / "processed").iterdir()) == [
        "0001.json",
        "0002.json",
        "0003.json",
        "0005.json",
    ]
    assert (inbox / ".0004.json.tmp").exists()

    # A message that keeps failing blocks its VM's later messages, then is dead-lettered.
    (inbox / "0006.json").write_text(envelope("vm3", 1, [event("EV-X")]))
    (inbox / "0007.json").write_text(envelope("vm3", 2, []))
    broken = LocalHost(
        inbox,
        pipeline.settings,
        store,
        pub,
        clock=clock,
        max_delivery_count=2,
        admission=pipeline.admission,
    )
    broken.pipeline.store = type(store)(store.service, "x")  # tables that do not exist
    first = broken.run_once()
    assert (first.failed, first.processed) == (1, 0)
    second = broken.run_once()
    assert second.dead_lettered == 1
    assert (inbox / "deadletter" / "0006.json").exists()
    assert (inbox / "deadletter" / "0006.json.reason.txt").read_text()
