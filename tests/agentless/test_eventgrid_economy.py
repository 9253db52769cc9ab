"""Table requests per Event Grid notification: what 100,000 VMs' worth of notifications cost."""

from __future__ import annotations

import json

from tests.agentless.grid import event, grid_event
from tests.agentless.queues import deliver
from tests.functions.conftest import make_pipeline
from tests.functions.test_store_economy import Calls


def requests(calls: Calls) -> dict[str, int]:
    return {
        f"{table}.{method}": calls.count(table, method)
        for table, method in calls.spies
        if calls.count(table, method)
    }


def test_requests_per_notification(store, clock, mocker):
    pipeline, _ = make_pipeline(store, clock)
    calls = Calls(store, mocker)
    first = grid_event(event("EV-E", "Reboot"), grid_id="g-1")
    deliver(json.dumps(first), pipeline)
    # The seen-marker, one read finding no row, the row created (decided in the same
    # write), then the reconcile by key: its announcements claimed, then marked done
    # (issue 46: the writer claims nothing), with the decision's audit row in that same
    # transaction (issue 47).
    assert requests(calls) == {
        "events.create_entity": 2,
        "events.get_entity": 1,
        "events.update_entity": 1,
        "events.submit_transaction": 1,
    }

    calls.reset()
    deliver(json.dumps(first), pipeline)  # Event Grid delivered it again
    # The failed insert of the seen-marker, and one read of the event row: what the event
    # still needs is read from it (a redelivery whose first host died), nothing written.
    assert requests(calls) == {"events.create_entity": 1, "events.get_entity": 1}

    calls.reset()
    same_state = grid_event(event("EV-E", "Reboot"), grid_id="g-2")
    deliver(json.dumps(same_state), pipeline)  # a new notification, nothing new
    assert requests(calls) == {"events.create_entity": 1, "events.get_entity": 1}

    calls.reset()
    started = grid_event({**event("EV-E", "Reboot"), "EventStatus": "Started"}, grid_id="g-3")
    deliver(json.dumps(started), pipeline)
    # Azure's Started written, then `started` claimed and marked done by the reconcile.
    assert requests(calls) == {"events.create_entity": 1, "events.update_entity": 3}
    assert calls.count("vms", "get_entity") == 0  # Event Grid never touches VM rows
