"""The crash-point explorer as the suite runs it (docs/crash-explorer.md): every scenario,
every crash point; a point whose end state differs from the fault-free run fails.

A scenario that still diverges on the current lifecycle is xfail(strict=True) with the
numbers measured, so the suite stays green while the lifecycle is fixed and turns red the
moment a fixed scenario passes (flip it) or regresses.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.crash.explore import equivalence, explore
from tests.crash.faults import Fault, Faults, HostCrash, Sent, installed
from tests.crash.scenarios import SCENARIOS, Scenario
from tests.crash.state import _bag, _entity, first_difference

pytestmark = pytest.mark.azurite

# Scenarios that still diverge, each with the numbers measured and why (xfail, strict).
# None since issue 31 (docs/crash-explorer.md, "Final"): a lifecycle change that makes a
# scenario diverge is fixed, or lands here with its reason for all to see.
DIVERGES: dict[str, str] = {}


# The longest scenarios' groups of equivalent points are run in this many shards, each a
# test of its own, so xdist spreads them over its workers: whole, `budget` alone took 266 s
# of a 764 s CI run, and the other workers waited at the end for it.
SHARDS = {
    "budget": 4,
    "capacity": 2,
    "decided-lost": 2,
    "drain-twice": 2,
    "set-mate-text": 2,
    "drain-reboot": 2,
}


def _params(scenario: Scenario) -> list[Any]:
    marks = []
    if scenario.name in DIVERGES:
        marks.append(
            pytest.mark.xfail(strict=True, raises=AssertionError, reason=DIVERGES[scenario.name])
        )
    n = SHARDS.get(scenario.name, 1)
    return [
        pytest.param(
            scenario, (i, n), id=scenario.name + (f"-{i + 1}of{n}" if n > 1 else ""), marks=marks
        )
        for i in range(n)
    ]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("scenario", "shard"), [p for s in SCENARIOS for p in _params(s)])
def test_no_crash_point_changes_the_end_state(
    azurite: str, scenario: Scenario, shard: tuple[int, int]
) -> None:
    report = explore(azurite, scenario, shard=shard, fork=True)
    print(report.table())
    assert report.baseline_errors == [], "the fault-free run itself failed a step"
    effects = json.dumps(report.effects)
    assert [e for e in scenario.expects if e not in effects] == [], effects
    # Every receiver is local and answers at once, but for the requests a scenario leaves
    # unanswered on purpose: any other that got no answer makes the baseline a matter of
    # timing (a deadline passed on a busy machine), and is named here.
    assert report.unplanned() == [], report.table()
    # Every request of the fault-free run is a crash point, answered or not (faults.py),
    # in one group of equivalent points or another; this shard ran its share of the groups.
    assert report.grouped_points == 2 * report.requests
    assert report.tried() == report.grouped_points or shard[1] > 1
    assert not report.different(), report.table()
    assert report.violations() == [], report.table()


def test_a_crash_cannot_be_swallowed_and_the_dead_host_stays_dead() -> None:
    faults = Faults(lambda *_: "x", fault=Fault(2, "before"), armed=True)
    assert faults.request("first") == (1, False)
    assert not issubclass(HostCrash, Exception)  # `except Exception` cannot swallow it
    with pytest.raises(HostCrash):
        faults.request("second")
    with pytest.raises(HostCrash):  # its finally blocks cannot write either
        faults.request("third")
    faults.revive()
    assert faults.request("fourth") == (3, False)


def test_every_http_request_of_the_process_is_counted(azurite: str) -> None:
    from azure.data.tables import TableServiceClient

    seen: list[str] = []
    faults = Faults(lambda host, port, method, path: f"{method} {path}", armed=True)
    with installed(faults):
        service = TableServiceClient.from_connection_string(azurite)
        list(service.list_tables())
        seen = list(faults.log)
        faults.fault = Fault(faults.count + 1, "lost")
        with pytest.raises(HostCrash):
            service.create_table("crashlost" + str(id(faults)))
    assert len(seen) == 1 and seen[0].startswith("GET ")
    # The table was created (applied), only its answer was lost.
    names = {t.name for t in TableServiceClient.from_connection_string(azurite).list_tables()}
    assert "crashlost" + str(id(faults)) in names


def test_equivalent_points_share_a_run_only_when_nothing_changed_in_between() -> None:
    t0, t1 = "10:00:00", "10:00:01"
    sent = [
        Sent(1, "table GET a", 0, 0, t0, False, t0),
        Sent(2, "table GET b", 0, 0, t0, False, t0),
        Sent(3, "table PUT c", 0, 0, t0, True, t0),
        Sent(4, "relay POST", 0, 1, t1, True, t1),  # the clock moved before it
        Sent(5, "table GET d", 1, 2, t1, False, t1),  # another step
    ]
    groups = sorted(sorted((f.index, f.kind) for f in g) for g in equivalence(sent).values())
    assert groups == [
        [(1, "before"), (1, "lost"), (2, "before"), (2, "lost"), (3, "before")],
        [(3, "lost")],
        [(4, "before")],
        [(4, "lost")],
        [(5, "before"), (5, "lost")],
    ]


def _event_row(**data: Any) -> dict[str, Any]:
    import json

    base = {
        "approval": "approved",
        "approved_by": "vm1",
        "announced": {"decided": "done", "approved": "done"},
        "decided_at": "2026-11-21T10:00:00Z",
        "approval_attempts": [
            {"at": "2026-11-21T10:00:00Z", "vm": "vm1", "outcome": "approved", "by": "policy"}
        ],
    }
    base.update(data)
    return {"PartitionKey": "ev-1", "RowKey": "event", "data": json.dumps(base), "etag": "x"}


def test_the_normalisation_hides_time_and_keeps_what_matters() -> None:
    want = {"events ev-1/event": _entity("events", _event_row())}
    later = _event_row(
        decided_at="2026-11-21T10:01:00Z",
        approval_attempts=[
            {"at": "2026-11-21T10:01:00Z", "vm": "vm1", "outcome": "approved", "by": "watchdog"},
            {"at": "2026-11-21T10:01:00Z", "vm": "vm1", "outcome": "approved", "by": "policy"},
        ],
    )
    assert first_difference(want, {"events ev-1/event": _entity("events", later)}) == ""
    lost = _event_row(approval="pending", approved_by=None)
    assert "data.approval" in first_difference(want, {"events ev-1/event": _entity("events", lost)})
    unannounced = _event_row(announced={"decided": "done", "approved": "pending:2026-11-21T10:00Z"})
    assert "announced.approved" in first_difference(
        want, {"events ev-1/event": _entity("events", unannounced)}
    )
    assert "extra" in first_difference({}, {"effect relay vm1 /v1/start EV-1": 1})


def test_audit_rows_alike_in_their_opening_stay_apart_and_tries_count_as_a_set() -> None:
    """Two audit rows that differ only after their 80th character are two entries (on
    75de079 the second overwrote the first, so an extra `skipped` or decision row of a
    crash run read "same"); a `retry_later` row counts once however many tries logged it
    (rule 13), an outcome row does not."""

    def audit(outcome: str, detail: str) -> dict[str, Any]:
        return {
            "PartitionKey": "ev-a",
            "RowKey": f"a|{outcome}{detail}",
            "EventId": "EV-A",
            "action": "approve",
            "by": "manual:alice",
            "detail": detail,
            "outcome": outcome,
        }

    base: dict[str, Any] = {}
    _bag(base, "audit", [audit("approved via relay:vm1", "")])
    crashed: dict[str, Any] = {}
    _bag(crashed, "audit", [audit("approved via relay:vm1", ""), audit("skipped: already", "")])
    assert "extra" in first_difference(base, crashed)
    twice: dict[str, Any] = {}
    _bag(twice, "audit", [audit("approved via relay:vm1", "")] * 2)
    assert "count 1 -> 2" in first_difference(base, twice)
    tries: dict[str, Any] = {}
    more: dict[str, Any] = {}
    _bag(tries, "audit", [audit("retry_later", "relay: unreachable")])
    _bag(more, "audit", [audit("retry_later", "relay: unreachable")] * 3)
    assert first_difference(tries, more) == ""


def test_requests_that_are_not_the_runs_pass_uncounted(azurite: str) -> None:
    """A thread an earlier test of the same worker left behind (a local host retrying
    against its stopped Azurite) must not join the run: stop 49's CI failed hold-window on
    one such request, read as the baseline's unanswered one."""
    import socket

    from azure.core.exceptions import ResourceNotFoundError, ServiceRequestError
    from azure.data.tables import TableServiceClient

    from tests.crash.explore import _classifier, _table_port
    from tests.crash.world import start_servers

    with socket.socket() as probe:  # a port nothing listens on: the stopped Azurite's
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    port = _table_port(azurite)
    servers = start_servers(lambda: "", lambda path: 200)
    try:
        faults = Faults(_classifier(azurite, servers), armed=True)
        with installed(faults):
            service = TableServiceClient.from_connection_string(azurite, retry_total=0)
            for table in ("x0123456789events", "sebridgeidentities"):  # the run's; another's
                with pytest.raises(ResourceNotFoundError):
                    service.get_table_client(table).get_entity("p", "r")
            stopped = TableServiceClient.from_connection_string(
                azurite.replace(f":{port}/", f":{dead}/"), retry_total=0
            )
            with pytest.raises(ServiceRequestError):
                stopped.get_table_client("sebridgeidentities").get_entity("p", "r")
    finally:
        servers.close()
    assert faults.log == ["table GET events(PartitionKey='p',RowKey='r')"], faults.log
    assert faults.count == 1 and len(faults.sent) == 1
    assert [f.split(" ", 1)[0] for f in faults.foreign] == ["GET", "GET"], faults.foreign
