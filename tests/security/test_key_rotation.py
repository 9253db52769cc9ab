"""A local user cannot lock the VM's own relay out with callback keys (issue 46, 5a).

Any process on a VM, root or not, can ask IMDS for attested documents, so a local user can
send attested messages in the VM's name, each with a callback key of its own making. The
app allows MAX_NEW_KEYS_PER_VM_DAY new keys a VM-day: four such keys used to spend the day's
bound, and the relay's next key (its rotation) was refused for the rest of the day. The
relay's key file is its own user's (0600 in a 0700 directory): what the local user cannot
make is the relay's proof, by its previous key, that its new key is its successor. A key
proved by the key the row holds as the relay's (its anchor) is a rotation: never counted,
and the anchor is never pushed out of the row by unproven keys.

The local user here runs the relay's own sending code with its own key file, against the
victim VM's IMDS: exactly what a non-root account on that VM can do.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from functions.identity.registry import Identity
from relay.keystore import KeyStore
from tests.security.conftest import Fleet, Vm
from tests.security.test_bounds import resource_graph_queries
from tests.security.test_one_vm import imds_event, user_event

pytestmark = pytest.mark.azurite


def local_user(fleet: Fleet, state: Path) -> Vm:
    """A non-root account on the victim VM: the victim's IMDS, a key file of its own."""
    victim = fleet.vms["victim"]
    return Vm(victim.name, victim.vm_id, victim.address, state, victim.imds, KeyStore(state))


def new_key(vm: Vm) -> None:
    """A key never seen before, without a previous one (no proof to send)."""
    vm.keys.path.unlink()
    vm.keys = KeyStore(vm.state)
    vm.sender.keys = vm.keys


def rotate(keys: KeyStore) -> None:
    """The relay's rotation (relay.keystore: once the current key is max_age old)."""
    max_age, keys.max_age = keys.max_age, 0
    try:
        assert keys.rotate_if_due()
    finally:
        keys.max_age = max_age


def identity(fleet: Fleet) -> Identity:
    found = fleet.pipeline.admission.registry.get(fleet.vms["victim"].vm_id)
    assert found is not None
    return found


def unproven_today(fleet: Fleet) -> int:
    return identity(fleet).new_keys_on(datetime.now(UTC).strftime("%Y-%m-%d"))


class ForgingKeys(KeyStore):
    """The local user's key file with a proof that names the relay's key: it cannot read
    that key's secret, so the proof is made with a secret of its own."""

    def __init__(self, state: Path, names: str) -> None:
        super().__init__(state)
        self.names = names

    def wire(self) -> dict[str, str]:
        return {**super().wire(), "prev": self.names, "proof": os.urandom(32).hex()}


def test_a_days_forged_keys_cannot_lock_out_the_relay_or_its_rotation(fleet: Fleet, tmp_path: Path):
    victim = fleet.vms["victim"]
    assert fleet.deliver(victim.message([])).outcome == "processed"
    relays = victim.keys.current_key().id
    local = local_user(fleet, tmp_path / "local-user")
    bound = fleet.pipeline.settings.max_new_keys_per_vm_day
    for _ in range(bound):  # the day's bound of new keys, spent
        new_key(local)
        assert fleet.deliver(local.message([])).outcome == "processed"
    new_key(local)
    over = fleet.deliver(local.message([]))
    assert over.outcome == "rejected" and "MAX_NEW_KEYS_PER_VM_DAY" in over.reason

    # The relay's own key is still the VM's: its messages are admitted, nothing counted.
    victim.sequence = local.sequence
    assert fleet.deliver(victim.message([])).outcome == "processed", fleet.rejected()
    assert identity(fleet).key(relays) is not None and unproven_today(fleet) == bound

    # The relay rotates: its new key, proved by the previous one, is taken (no Resource
    # Graph query, not counted), and the app's callbacks are signed with it.
    rotate(victim.keys)
    queries = resource_graph_queries(fleet)
    event_id, events = user_event(fleet, "victim")
    result = fleet.deliver(victim.message(events))
    assert result.outcome == "processed", result
    stored = identity(fleet)
    assert stored.current_key is not None
    assert stored.current_key.key_id == victim.keys.current_key().id == stored.anchor
    assert unproven_today(fleet) == bound and resource_graph_queries(fleet) == queries
    record = fleet.store.get_event(event_id)
    assert record.approval == "approved" and record.approved_by == "victim"
    assert imds_event(fleet, "victim", event_id)["EventStatus"] == "Started"


def test_a_forged_proof_is_refused_with_the_reason(fleet: Fleet, tmp_path: Path):
    victim = fleet.vms["victim"]
    assert fleet.deliver(victim.message([])).outcome == "processed"
    relays = victim.keys.current_key().id
    local = local_user(fleet, tmp_path / "local-user")
    local.keys = local.sender.keys = ForgingKeys(local.state, relays)

    result = fleet.deliver(local.message([]))

    assert result.outcome == "rejected", result
    assert "callback_key.proof" in result.reason and "does not verify" in result.reason
    assert relays in result.reason
    stored = identity(fleet)
    assert stored.key(local.keys.current_key().id) is None and unproven_today(fleet) == 0
    assert stored.current_key is not None and stored.current_key.key_id == relays
    # Legitimate: the relay's own messages go on.
    assert fleet.deliver(victim.message([])).outcome == "processed"


def test_a_proof_by_any_key_but_the_relays_counts_as_unproven(fleet: Fleet, tmp_path: Path):
    """A proof by a key the row does not hold proves nothing; nor does one by a key the
    local user itself enrolled (the row holds it too, but it is not the relay's)."""
    victim = fleet.vms["victim"]
    assert fleet.deliver(victim.message([])).outcome == "processed"
    relays = victim.keys.current_key().id
    local = local_user(fleet, tmp_path / "local-user")

    rotate(local.keys)  # a proof by a key the app never saw
    assert fleet.deliver(local.message([])).outcome == "processed"
    assert unproven_today(fleet) == 1
    rotate(local.keys)  # a proof by the local user's key the row now holds
    assert fleet.deliver(local.message([])).outcome == "processed"

    stored = identity(fleet)
    assert stored.key(relays) is not None, "the relay's key was pushed out of the row"
    assert unproven_today(fleet) == 2 and stored.anchor == relays
    victim.sequence = local.sequence
    assert fleet.deliver(victim.message([])).outcome == "processed"
    assert unproven_today(fleet) == 2
