"""Relay contract 2 (issue 44): liveness rows carry `contract`, `probe_at` and `drain`, signed
(liveness/v2); the app reads contracts 1 and 2 (ACCEPTED_CONTRACTS) and refuses others by name.

The v2 rows of the first tests are written by the relay's own code
(relay.liveness.TableLiveness) into Azurite with the add + update SAS a relay has, and read
back by the app's store: the two sides of the contract meet on a real table, not on each
other's constants.
"""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import UTC, datetime
from pathlib import Path

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
    row_keys_for,
    to_hint,
)
from local.azurite import table_sas, table_url
from relay import CONTRACT, __version__
from relay.liveness import TableLiveness
from relay.models import Envelope, VmRef
from tests.functions.conftest import vm_id_of
from tests.relay.conftest import FixedKeys

SECRET = b"s" * 32
KID = hashlib.sha256(SECRET).hexdigest()[:16]
ROOT = Path(__file__).resolve().parents[2]
VM = vm_id_of("web_1")
VERIFY = DictVerifier({VM: ("web_1", {KID: SECRET})})
AT = 1_800_000_000


def _relay_writes(store, azurite: str, facts=lambda: (0, "")) -> None:
    """The relay's TableLiveness writes its heartbeat row into the app's liveness table."""
    table = store.liveness.name
    TableLiveness(
        table_url(azurite, table), sas=table_sas(table), keys=FixedKeys(SECRET), facts=facts
    ).write(
        Envelope(
            kind="heartbeat",
            vm=VmRef(name="web_1", vm_id=VM),
            sequence=1,
            observed_at=datetime.now(UTC),
            relay_version=__version__,
        )
    )


def test_a_v2_row_written_by_the_relay_is_read_with_its_probe_and_drain(store, azurite) -> None:
    probe = int(datetime.now(UTC).timestamp()) - 7
    _relay_writes(store, azurite, lambda: (probe, "hook,readiness"))
    hint = store.liveness.get(VM, VERIFY, print)
    assert hint is not None and hint.name == "web_1" and hint.relay_version == __version__
    assert hint.contract == CONTRACT == 2
    assert hint.probe_at == datetime.fromtimestamp(probe, UTC)
    assert hint.drain == ("hook", "readiness")


def test_a_v2_row_never_probed_and_with_no_drain_means_says_so(store, azurite) -> None:
    _relay_writes(store, azurite)
    hint = store.liveness.get(VM, VERIFY, print)
    assert hint is not None and (hint.contract, hint.probe_at, hint.drain) == (2, None, ())


def test_a_v2_row_whose_probe_or_drain_was_changed_is_not_believed(store, azurite) -> None:
    """Another VM may write any row (Table RBAC cannot scope rows): it cannot make this
    VM look probed, or offer a drain it does not, without the VM's key."""
    _relay_writes(store, azurite, lambda: (0, "hook"))
    pk, rk = row_keys_for(SECRET)
    for change in ({"probe_at": AT}, {"drain": "hook,readiness"}, {"contract": 1}):
        row = dict(store.liveness.table.get_entity(pk, rk))
        store.liveness.table.upsert_entity({**row, **change}, mode=UpdateMode.REPLACE)
        skipped: list = []
        assert store.liveness.get(VM, VERIFY, skipped.append) is None
        assert skipped and "not verified" in skipped[0].reason
        _relay_writes(store, azurite, lambda: (0, "hook"))


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
    assert {1, CONTRACT} == ACCEPTED_CONTRACTS


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


def test_the_readme_states_which_relay_versions_this_app_accepts() -> None:
    """relay/README.md's statement is ACCEPTED_CONTRACTS and names this relay's version and
    the previous release's."""
    text = (ROOT / "relay" / "README.md").read_text()
    found = re.search(r"accepts\s+relay\s+contracts?\s+([0-9,\sand]+)", text)
    assert found, "relay/README.md must say which relay contracts the app accepts"
    assert {int(n) for n in re.findall(r"\d+", found.group(1))} == set(ACCEPTED_CONTRACTS)
    assert f"`{__version__}`" in text and "`0.1.0`" in text
