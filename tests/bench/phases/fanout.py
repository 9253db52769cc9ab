"""Phase `fanout`: 100 VMs of one availability set report one event at the same moment
(16 concurrent ingests), and Teams must get one post (`notifications_per_event`)."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from functions.pipeline.ingest import ingest_message
from functions.pipeline.publish import LocalPublisher
from tests.bench.documents import envelope, reboot
from tests.bench.documents import pipeline as make_pipeline
from tests.bench.runner import Phase


def notifications_per_event(connection_string: str, vms: int = 100) -> dict[str, Any]:
    """100 VMs of one availability set report one event (naming them all) at once."""
    from functions.notify.delivery import Transport
    from functions.notify.dispatch import deliver
    from functions.notify.settings import ChannelSettings
    from local.receivers import TeamsReceiver

    with TeamsReceiver() as teams:
        publisher = LocalPublisher()
        settings = ChannelSettings(teams_webhook_url=teams.url)
        transport = Transport(session=requests.Session())
        publisher.subscribe(
            "teams",
            lambda note: deliver("teams", note.to_json(), settings=settings, transport=transport),
        )
        pipeline = make_pipeline(connection_string, "benchfanout", publisher)
        names = [f"as-vm-{i:03d}" for i in range(vms)]
        event_id = str(uuid.uuid4()).upper()
        # An event naming every VM of the set: a VM speaks only for itself (per-VM
        # identity), so each of the 100 reports counts only if the event names its VM.
        event = reboot(event_id, names, "Scheduled")
        bodies = [envelope(name, 1, [event], "bigset") for name in names]
        with ThreadPoolExecutor(max_workers=16) as pool:
            results = list(pool.map(lambda body: ingest_message(body, pipeline), bodies))
        posts = [r for r in teams.accepted() if event_id.encode() in r.raw]
    if any(r.outcome != "processed" for r in results):
        raise RuntimeError("not every report was processed")
    return {
        "notifications_per_event": len(posts),
        "fanout_reports": len(results),
        "fanout_transitions": publisher.transitions(event_id),
    }


PHASE = Phase(
    "fanout",
    lambda a: "fan-out: 100 VMs of one availability set report one event",
    lambda b: notifications_per_event(b.azurite("state")),
    azurite="state",
    targets={"notifications_per_event": ("==", 1)},
)
