"""Documents as relays send them, and a pipeline on Azurite to ingest them: what the
ingest and fan-out phases feed the app (tests/bench/phases/ingest.py, fanout.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import requests


def pipeline(connection_string: str, prefix: str, publisher: Any) -> Any:
    from functions.clock import SystemClock
    from functions.pipeline.context import Pipeline
    from functions.settings import load_settings
    from functions.store.state import Store
    from tests.bench.attested import APP_SECRET, admission

    settings = load_settings(
        state_storage=connection_string, app_secret=APP_SECRET, state_table_prefix=prefix
    )
    store = Store.from_settings(settings).ensure_tables()
    return Pipeline(
        store, settings, publisher, requests.Session(), SystemClock(), admission=admission(store)
    )


def envelope(vm: str, sequence: int, events: list[dict[str, Any]], aset: str) -> str:
    """A relay's document, attested for its exact bytes (tests.bench.attested)."""
    from functions.model.envelope import Envelope, VmRef
    from tests.bench.attested import attested

    return attested(
        Envelope(
            kind="document",
            vm=VmRef(name=vm, availability_set=aset),
            relay_version="bench",
            sequence=sequence,
            observed_at=datetime.now(UTC),
            document={"DocumentIncarnation": sequence, "Events": events},
        ).to_json()
    )


def imds_time(at: datetime) -> str:
    return at.strftime("%a, %d %b %Y %H:%M:%S GMT")


def in_an_hour() -> str:
    return imds_time(datetime.now(UTC) + timedelta(hours=1))


def reboot(
    event_id: str, resources: list[str], status: str, not_before: datetime | None = None
) -> dict[str, Any]:
    """A Platform Reboot as IMDS shows it; a Scheduled one's NotBefore is `not_before`, or
    an hour ahead of now."""
    return {
        "EventId": event_id,
        "EventStatus": status,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        # An hour ahead: the app refuses a NotBefore more than MAX_NOT_BEFORE_DAYS ahead.
        "NotBefore": (in_an_hour() if not_before is None else imds_time(not_before))
        if status == "Scheduled"
        else "",
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
