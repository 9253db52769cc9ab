"""Relay contract 2 (issue 44): liveness rows carry `contract`, `probe_at` and `drain`, signed
(liveness/v2); the app reads contracts 1 and 2 (ACCEPTED_CONTRACTS) and refuses others by name.

Rows are read back from Azurite by the app's store where the test is about what the store
does with them.
"""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import UTC, datetime

import pytest
from azure.data.tables import UpdateMode

from functions.identity.keys import liveness_signature, liveness_signature_v2
from functions.store.liveness import (
    ACCEPTED_CONTRACTS,
    BadHint,
    DictVerifier,
    UnknownContract,
    check_row,
    liveness_partition,
    to_hint,
)
from tests.functions.conftest import vm_id_of

SECRET = b"s" * 32
KID = hashlib.sha256(SECRET).hexdigest()[:16]
VM = vm_id_of("web_1")
VERIFY = DictVerifier({VM: ("web_1", {KID: SECRET})})
AT = 1_800_000_000


def _v1_row(secret: bytes = SECRET) -> dict:
    """A relay 0.1.x row (contract 1): no contract, probe_at or drain; signed liveness/v1."""
    return {
        "PartitionKey": liveness_partition(VM),
        "RowKey": VM,
        "seen": datetime.fromtimestamp(AT, UTC),
        "at": AT,
        "relay_version": "0.1.0",
        "key_id": KID,
        "sig": liveness_signature(secret, VM, AT, "0.1.0"),
    }


def _v2_row(contract: int = 2, probe_at: int = AT - 5, drain: str = "readiness") -> dict:
    sig = liveness_signature_v2(SECRET, VM, AT, "0.2.0", contract, probe_at, drain)
    return {
        **_v1_row(),
        "relay_version": "0.2.0",
        "contract": contract,
        "probe_at": probe_at,
        "drain": drain,
        "sig": sig,
    }


def test_rows_of_the_previous_release_are_still_read_as_contract_1() -> None:
    hint = to_hint(_v1_row(), VERIFY)
    assert (hint.contract, hint.probe_at, hint.drain, hint.relay_version) == (1, None, (), "0.1.0")
    assert {1, 2} == ACCEPTED_CONTRACTS


def test_a_v1_signature_does_not_vouch_for_v2_columns() -> None:
    """A v2 row must be signed v2: a v1 signature over the same row leaves the probe and
    drain columns unsigned, so it is refused."""
    row = {**_v2_row(), "sig": liveness_signature(SECRET, VM, AT, "0.2.0")}
    with pytest.raises(BadHint, match="not verified"):
        to_hint(row, VERIFY)
    assert to_hint(_v2_row(), VERIFY).probe_at == datetime.fromtimestamp(AT - 5, UTC)


def test_a_contract_this_app_does_not_read_is_refused_loudly(store, caplog) -> None:
    row = _v2_row(contract=3)
    with pytest.raises(UnknownContract, match="relay contract 3 is not one this app reads"):
        check_row(row)
    # Through the store: refused by name, logged as an error, never read as contract 2.
    store.liveness.table.upsert_entity(row, mode=UpdateMode.REPLACE)
    skipped: list = []
    with caplog.at_level(logging.ERROR, logger="functions.store.liveness"):
        assert store.liveness.get(VM, VERIFY, skipped.append) is None
    assert "upgrade the function app" in skipped[0].reason
    assert any(r.levelno == logging.ERROR for r in caplog.records)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"contract": "2"}, "`contract` is not a number"),
        ({"probe_at": -1}, "probe_at"),
        ({"probe_at": True}, "probe_at"),
        ({"drain": "x" * 65}, "64 characters"),
        ({"drain": "hook,teleport"}, "drain means"),
        ({"drain": None}, "`drain`"),
    ],
)
def test_malformed_v2_columns_are_named(change, why) -> None:
    with pytest.raises(BadHint, match=re.escape(why)):
        check_row({**_v2_row(), **change})


def test_a_v2_row_in_the_table_is_read_and_a_changed_probe_or_drain_is_not(store) -> None:
    """Another VM may write any row (Table RBAC cannot scope rows): it cannot make this VM
    look probed, or offer a drain it does not, without the VM's key."""
    store.liveness.table.upsert_entity(_v2_row(drain="hook,readiness"), mode=UpdateMode.REPLACE)
    hint = store.liveness.get(VM, VERIFY, print)
    assert hint is not None and hint.contract == 2 and hint.drain == ("hook", "readiness")
    assert hint.probe_at == datetime.fromtimestamp(AT - 5, UTC)
    for change in ({"probe_at": AT}, {"drain": "hook"}, {"contract": 1}):
        forged = {**_v2_row(drain="hook,readiness"), **change}
        store.liveness.table.upsert_entity(forged, mode=UpdateMode.REPLACE)
        skipped: list = []
        assert store.liveness.get(VM, VERIFY, skipped.append) is None
        assert "not verified" in skipped[0].reason
