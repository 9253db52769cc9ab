"""The app's state is written by the app alone; what relays may write is read as hints.

The attacker holds the relay's table right: Insert and Merge on `{prefix}liveness` only
(the custom role in Azure; here a SAS of the same rights on Azurite, as the demo's relays
use). It tries the app's tables, then forges liveness rows for the victim.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.core.credentials import AzureSasCredential
from azure.core.exceptions import HttpResponseError
from azure.data.tables import EdmType, EntityProperty, TableClient, UpdateMode

from functions.identity.keys import liveness_signature
from functions.pipeline.watchdog import run_watchdog
from functions.store.liveness import liveness_partition
from local.azurite import table_sas
from tests.security.conftest import Fleet


def relay_credential(fleet: Fleet, table: str) -> TableClient:
    """The attacker's table client: the liveness SAS, aimed at `table`."""
    sas = table_sas(f"{fleet.store.prefix}liveness")
    return TableClient(fleet.store.service.url, table, credential=AzureSasCredential(sas))


def row(vm_id: str, at: datetime, key_id: str, secret: bytes, version: str = "x") -> dict:
    unix = int(at.timestamp())
    return {
        "PartitionKey": liveness_partition(vm_id),
        "RowKey": vm_id,
        "seen": datetime.fromtimestamp(unix, UTC),
        "at": EntityProperty(unix, EdmType.INT64),
        "relay_version": version,
        "key_id": key_id,
        "sig": liveness_signature(secret, vm_id, unix, version),
    }


class Later:
    """The app's clock, some hours on."""

    def __init__(self, hours: float) -> None:
        self.offset = timedelta(hours=hours)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def sleep(self, seconds: float) -> None:
        pass


@pytest.mark.parametrize("table", ["vms", "identities", "events", "audit", "rejected"])
def test_the_relay_credential_cannot_write_the_apps_tables(fleet: Fleet, table: str):
    fleet.deliver(fleet.vms["victim"].message([]))
    victim = fleet.vms["victim"]
    forged = {"PartitionKey": "vm00", "RowKey": "victim", "data": "{", "callback_url": "x"}
    with pytest.raises(HttpResponseError) as refused:
        relay_credential(fleet, f"{fleet.store.prefix}{table}").upsert_entity(
            forged, mode=UpdateMode.MERGE
        )
    assert refused.value.status_code == 403
    # Legitimate: its own liveness row goes in with the same credential.
    key = victim.keys.current_key()
    own = row(victim.vm_id, datetime.now(UTC), key.id, key.secret)
    relay_credential(fleet, f"{fleet.store.prefix}liveness").upsert_entity(
        own, mode=UpdateMode.MERGE
    )


def test_forged_liveness_rows_are_skipped_reported_and_page_nobody(fleet: Fleet):
    attacker, victim = fleet.vms["attacker"], fleet.vms["victim"]
    for vm in (attacker, victim):
        fleet.deliver(vm.message([]))
    writer = relay_credential(fleet, f"{fleet.store.prefix}liveness")
    now = datetime.now(UTC)
    mine = attacker.keys.current_key()
    # The victim's row, signed with the attacker's key: not believed, never pages.
    writer.upsert_entity(row(victim.vm_id, now - timedelta(hours=1), mine.id, mine.secret))
    # A row dated a year ahead (it would keep a dead relay out of the silence query).
    stranger = "0badc0de-0000-4000-8000-000000000002"
    writer.upsert_entity(row(stranger, now + timedelta(days=365), mine.id, mine.secret))
    # Legitimate: the attacker's own genuine row, an hour old, is a silent relay.
    writer.upsert_entity(row(attacker.vm_id, now - timedelta(hours=1), mine.id, mine.secret))

    fleet.pipeline.clock = Later(hours=2)  # the sweep two hours on: no message since
    report = run_watchdog(fleet.pipeline)

    assert report.silent == ["attacker"]
    skipped = " | ".join(report.skipped)
    assert f"{victim.vm_id}: not verified" in skipped, report.skipped
    assert f"{stranger}: dated in the future" in skipped, report.skipped
    silent = [n.vm for n in fleet.publisher.published if n.transition == "relay_silent"]
    assert silent == ["attacker"]
