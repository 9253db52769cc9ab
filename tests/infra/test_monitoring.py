"""Alerts and the workbook query what the app really logs (functions/telemetry.py).

The KQL strings are read out of infra/modules/monitoring.bicep; every field, kind and
transition they name must be one the code emits, or an alert would silently never fire.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest

from functions import telemetry
from functions.model.event import Decision, EventSnapshot, Notification, Transition
from functions.pipeline.results import Reconciled
from tests.infra.bicep import MODULES, ROOT, dotted, iso_minutes, load, module_params
from tests.infra.bicep_evaluator import Evaluator

MON = load("monitoring")
ALERTS = MON.variables["logAlerts"]
WORKBOOK = MON.variables["workbookQueries"]


def query_text(query: str | dict, **params: int) -> str:
    """A query as deployed: a constant, or replace(constant, NAME, string(param)) with
    the parameter's value (`params`, else its default)."""
    if isinstance(query, str):
        return query
    call = query["function"]
    assert call["type"] == "replace", query
    args = call["parameters"]
    value = args["new_string"]["function"]
    assert value["type"] == "string", query
    param = value["parameters"]["value_to_convert"]
    number = params.get(param, MON.params[param]["default"])
    return args["original_string"].replace(args["old_string"], str(number))


QUERIES = {f"alert {a['name']}": query_text(a["query"]) for a in ALERTS} | {
    f"workbook {w['title']}": query_text(w["query"]) for w in WORKBOOK
}


def test_every_kql_string_in_the_file_is_checked_here() -> None:
    text = (MODULES / "monitoring.bicep").read_text()
    assert text.count("'''") == 2 * len(QUERIES)


def test_the_required_alerts_exist() -> None:
    assert {a["name"] for a in ALERTS} == {
        "function-failures",
        "watchdog-not-running",
        "relay-silent",
        "approval-failed",
        "policy-invalid",
        "admission-rejections",
    }
    (metric,) = MON.resources("Microsoft.Insights/metricAlerts")
    criterion = metric.body["properties"]["criteria"]["allOf"][0]
    assert criterion["metricName"] == "DeadletteredMessages"
    assert criterion["dimensions"][0]["name"] == "EntityName"
    assert metric.loop is not None  # one alert per entity
    entities = module_params(load("main"), "monitoring")["deadLetterEntities"]
    # Every queue (documents, heartbeats, the Event Grid queue) and the topic.
    assert [dotted(e) for e in entities] == [
        "serviceBus.outputs.queueName",
        "serviceBus.outputs.heartbeatsQueueName",
        "eventGrid.outputs.queueName",
        "serviceBus.outputs.topicName",
    ]


def test_sampling_never_drops_the_rows_alerts_and_workbook_read() -> None:
    """Adaptive sampling drops what excludedTypes does not list: the alerts and the workbook
    read traces (the app's log lines) and requests, so both are excluded (issue #23)."""
    sampling = json.loads((ROOT / "host.json").read_text())["logging"]["applicationInsights"]
    settings = sampling["samplingSettings"]
    excluded = {t.strip() for t in settings.get("excludedTypes", "").split(";")}
    tables = {q.lstrip().split()[0] for q in QUERIES.values()}
    needed = {"traces": "Trace", "requests": "Request", "exceptions": "Exception"}
    assert tables <= set(needed), tables
    if settings.get("isEnabled", True):
        assert {needed[t] for t in tables} <= excluded


def test_watchdog_window_is_one_a_log_alert_accepts() -> None:
    """The window sizes below were written from memory by the first review (the portal's
    aggregation granularities). Not confirmed against a published list in this review (the
    Microsoft.Insights/scheduledQueryRules reference types windowSize as an ISO 8601 duration
    without an enumeration: "Create or edit a log search alert rule",
    https://learn.microsoft.com/azure/azure-monitor/alerts/alerts-create-log-alert-rule):
    the rule's creation validates it (infra/README.md, verify on first deploy)."""
    allowed = MON.decorator("watchdogSilentMinutes", "allowed")
    windows = {1, 5, 10, 15, 30, 45, 60, 120, 180, 240, 300, 360, 1440, 2880}
    assert set(allowed) <= windows and min(allowed) >= 5  # evaluationFrequency is PT5M
    expression = MON.tree["variables"]["watchdogWindow"]["value"]
    shown = {m: Evaluator(MON, {"watchdogSilentMinutes": m}).eval(expression) for m in allowed}
    assert shown[10] == "PT10M" and shown[60] == "PT1H" and shown[360] == "PT6H"
    assert all(iso_minutes(w) == m for m, w in shown.items())


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_queries_use_only_what_the_app_logs(name: str) -> None:
    query = QUERIES[name]
    if "parse_json" not in query:
        assert query.lstrip().startswith("requests"), name  # the platform's own table
        return
    # The line is "sebridge {json}": the prefix is exactly what substring() skips.
    assert 'message startswith "sebridge "' in query
    assert f"substring(message, {len(telemetry.PREFIX)})" in query
    fields = set(re.findall(r"\bd\.(\w+)", query))
    assert fields <= set(telemetry.FIELDS), fields - set(telemetry.FIELDS)
    kinds = re.findall(r'd\.kind\)\s*==\s*"(\w+)"', query)
    assert kinds and set(kinds) <= set(telemetry.KINDS)
    named = re.findall(r'd\.transition\)\s*==\s*"(\w+)"', query)
    for group in re.findall(r"d\.transition\)\s+in\s+\(([^)]*)\)", query):
        named += re.findall(r'"(\w+)"', group)
    assert set(named) <= {t.value for t in Transition}, named


COUNTED = [a for a in ALERTS if a["name"] != "admission-rejections"]


@pytest.mark.parametrize("alert", COUNTED, ids=lambda a: a["name"])
def test_each_alert_sums_its_own_count_column(alert: dict) -> None:
    # A `summarize x = count()` always returns a row, so the rule sums x (Total), never
    # counts rows; "not running" is x < 1, everything else x > 0.
    text = query_text(alert["query"])
    summarize = re.search(rf"summarize {alert['measure']} = count\(\)(?: by (.*))?", text)
    assert summarize, text
    # Each dimension the rule splits on is a column the query groups by.
    grouped = {c.split("=")[0].strip() for c in (summarize[1] or "").split(",") if c.strip()}
    assert set(alert["dimensions"]) == grouped
    (rules,) = MON.resources("Microsoft.Insights/scheduledQueryRules")
    criterion = rules.body["properties"]["criteria"]["allOf"][0]
    assert criterion["timeAggregation"] == "Total"
    assert dotted(criterion["metricMeasureColumn"]) == "rule.measure"
    expected = ("LessThan", 1) if alert["name"] == "watchdog-not-running" else ("GreaterThan", 0)
    assert (alert["operator"], alert["threshold"]) == expected


def _lines(caplog) -> list[dict]:
    return [
        json.loads(r.getMessage()[len(telemetry.PREFIX) :])
        for r in caplog.records
        if r.getMessage().startswith(telemetry.PREFIX)
    ]


def test_what_the_app_writes_carries_every_field_the_queries_read(caplog) -> None:
    caplog.set_level("INFO", logger="sebridge.telemetry")
    now = datetime(2026, 11, 21, 10, tzinfo=UTC)
    event = EventSnapshot(
        event_id="EV-T",
        event_type="Reboot",
        event_status="Scheduled",
        resources=("vm1",),
        not_before=now,
    )
    decision = Decision(action="hold", rule="default-hold")
    for transition in Transition:
        silent = transition in (Transition.RELAY_SILENT, Transition.RELAY_RECOVERED)
        telemetry.transition(
            Notification(
                transition=transition,
                occurred_at=now,
                event=None if silent else event,
                vm="vm1" if silent else None,
                decision=decision,
            )
        )

    class Report:
        silent, due, handed, skipped_rows = [], 0, 0, 0

    telemetry.watchdog_run(Report())
    telemetry.reconciled(Reconciled("EV-T"))
    telemetry.admission(7, 3, 1, {"chain": 1})
    telemetry.manual_approval("EV-T", "manual:alice", "approved", "")
    lines = _lines(caplog)
    by_kind: dict[str, set[str]] = {}
    for line in lines:
        by_kind.setdefault(line["kind"], set()).update(line)
    assert {line.get("transition") for line in lines} >= {t.value for t in Transition}
    for name, query in QUERIES.items():
        if "parse_json" not in query:
            continue
        (kind,) = set(re.findall(r'd\.kind\)\s*==\s*"(\w+)"', query))
        used = set(re.findall(r"\bd\.(\w+)", query))
        assert used <= by_kind[kind], (name, used - by_kind[kind])
    # The same fields go out as logging extra too (customDimensions).
    record = next(r for r in caplog.records if r.getMessage().startswith(telemetry.PREFIX))
    assert record.sebridge_kind == "transition"


def test_fields_outside_the_contract_are_refused() -> None:
    with pytest.raises(ValueError, match="outside the contract"):
        telemetry.emit("transition", {"transitionn": "decided"})
    with pytest.raises(ValueError, match="unknown telemetry kind"):
        telemetry.emit("heartbeat", {})


ADMISSION = next(a for a in ALERTS if a["name"] == "admission-rejections")


def test_the_rejection_share_alert_is_a_share_of_what_admission_judged() -> None:
    """Over 15 minutes, rejected / (admitted + rejected) from the `admission` lines
    (functions.pipeline.admission_tally), above the admissionRejectPercent parameter, once
    at least admissionRejectMinimum messages were rejected (issue 33: the old minimum of 50
    messages judged is never reached by a small fleet, which sends a few per event)."""
    query = QUERIES["alert admission-rejections"]
    assert 'tostring(d.kind) == "admission"' in query
    assert re.search(
        r"summarize rejected = sum\(toint\(d\.rejected\)\), "
        r"judged = sum\(toint\(d\.admitted\)\) \+ sum\(toint\(d\.rejected\)\)",
        query,
    )
    assert "where judged >=" not in query
    assert re.search(r"where rejected >= 3\n", query)
    assert "where rejected >= 7\n" in query_text(ADMISSION["query"], admissionRejectMinimum=7)
    assert "extend rejected_percent = 100.0 * rejected / judged" in query
    assert ADMISSION["measure"] == "rejected_percent" and ADMISSION["dimensions"] == []
    assert (ADMISSION["operator"], ADMISSION["window"]) == ("GreaterThan", "PT15M")
    assert dotted(ADMISSION["threshold"]) == "admissionRejectPercent"
    assert MON.params["admissionRejectPercent"]["default"] == 20
    assert MON.params["admissionRejectMinimum"]["default"] == 3
    assert (
        MON.decorator("admissionRejectPercent", "min_value"),
        MON.decorator("admissionRejectPercent", "max_value"),
    ) == (1, 100)
    assert MON.decorator("admissionRejectMinimum", "min_value") == 1
    main = load("main")
    wired = module_params(main, "monitoring")
    for name in ("admissionRejectPercent", "admissionRejectMinimum"):
        assert dotted(wired[name]) == name
        assert main.params[name]["default"] == MON.params[name]["default"]


def _share(lines: list[dict], minimum: int) -> float | None:
    """The alert's query, evaluated over log lines the app wrote (None: no row)."""
    rejected = sum(int(x["rejected"]) for x in lines)
    judged = sum(int(x["admitted"]) for x in lines) + rejected
    return 100.0 * rejected / judged if rejected >= minimum else None


def test_the_alert_fires_on_a_mismatch_in_a_small_fleet_not_on_one_bad_vm(caplog) -> None:
    """What Admission really logs, fed through the alert's arithmetic."""
    from functions.pipeline.admission_tally import AdmissionTally

    caplog.set_level("INFO", logger="sebridge.telemetry")
    minimum = int(re.search(r"where rejected >= (\d+)", QUERIES["alert admission-rejections"])[1])
    threshold = MON.params["admissionRejectPercent"]["default"]
    now = datetime(2026, 11, 21, 10, tzinfo=UTC)

    def window(admitted: int, rejected: int) -> float | None:
        caplog.clear()
        tally = AdmissionTally()
        for n in range(admitted + rejected):
            tally.count("rejected" if n < rejected else "admitted", now)
        tally.flush(now)
        return _share([x for x in _lines(caplog) if x["kind"] == "admission"], minimum)

    one_bad_vm = window(admitted=500, rejected=20)  # one VM retrying a bad message
    assert one_bad_vm is not None and one_bad_vm <= threshold
    assert window(admitted=3, rejected=2) is None  # two messages say little
    mismatch = window(admitted=100, rejected=400)  # Azure's documents refused everywhere
    assert mismatch is not None and mismatch > threshold
    # A ten-VM fleet during one event: its few documents, most of them refused. The old
    # query (at least 50 judged) never fired here.
    small = window(admitted=3, rejected=6)
    assert small is not None and small > threshold


def test_the_alerts_name_a_receiver_or_say_none_loudly() -> None:
    """The bridge-down alerts must reach someone: every alert notifies the bridge's action
    group (alertEmail) and, when given, the operator's existing one (alertActionGroupId);
    with neither, the deployment's alertReceivers output starts with NONE."""
    main = load("main")
    for name in ("alertEmail", "alertActionGroupId"):
        assert main.params[name]["default"] == ""
        assert dotted(module_params(main, "monitoring")[name]) == name
    assert dotted(main.outputs["alertReceivers"]["value"]) == "monitoring.outputs.alertReceivers"
    expression = MON.tree["outputs"]["alertReceivers"]["value"]

    def receivers(**values: str) -> str:
        return Evaluator(MON, {"alertEmail": "", "alertActionGroupId": "", **values}).eval(
            expression
        )

    assert receivers().startswith("NONE: ") and "alertEmail or alertActionGroupId" in receivers()
    assert receivers(alertEmail="oncall@example.com") == "e-mail oncall@example.com"
    group = "/subscriptions/0/resourceGroups/ops/providers/Microsoft.Insights/actionGroups/oncall"
    assert receivers(alertActionGroupId=group) == f"action group {group}"
    groups = MON.tree["variables"]["alertActionGroups"]["value"]
    own, *none = Evaluator(MON, {"alertActionGroupId": ""}).eval(groups)
    assert none == [] and own.why == "resource property"  # alerts.id, the bridge's own
    own, *given = Evaluator(MON, {"alertActionGroupId": group}).eval(groups)
    assert given == [group] and own.why == "resource property"
    # Both kinds of alert use the list.
    text = (MODULES / "monitoring.bicep").read_text()
    assert "actionGroups: alertActionGroups" in text
    assert "[for group in alertActionGroups:" in text
    assert "actionGroupId: alerts.id" not in text
    # main.bicepparam reads both from the environment, as the README's deploy block sets them.
    bicepparam = (ROOT / "infra" / "main.bicepparam").read_text()
    assert "readEnvironmentVariable('ALERT_EMAIL', '')" in bicepparam
    assert "readEnvironmentVariable('ALERT_ACTION_GROUP_ID', '')" in bicepparam
