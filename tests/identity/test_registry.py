"""The identities table against Azurite: facts and wrapped keys per vmId, ETag-guarded,
current/previous key rotation, and the facts cache in front of Resource Graph."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError
from azure.data.tables import TableServiceClient

from functions.identity.facts import FactsUnavailable, StaticResolver, UnknownVm, VmFacts
from functions.identity.keys import CallbackKey, KeyProof, key_proof
from functions.identity.registry import (
    CachedResolver,
    ForgedProof,
    Identity,
    IdentityStore,
    partition_of,
)

pytestmark = pytest.mark.azurite

APP = b"S" * 40
T0 = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)


def facts(vm_id: str, name: str = "vm1", at: datetime = T0, address: str = "10.0.0.4"):
    return VmFacts(
        vm_id=vm_id,
        name=name,
        resource_id=f"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/"
        f"virtualMachines/{name}",
        subscription_id="00000000-0000-0000-0000-000000000000",
        resource_group="rg",
        scale_set=None,
        availability_set=None,
        address=address,
        fetched_at=at,
    )


@pytest.fixture
def store(azurite: str) -> IdentityStore:
    service = TableServiceClient.from_connection_string(azurite)
    return IdentityStore.from_service(
        service, APP, prefix="t" + uuid.uuid4().hex[:12]
    ).ensure_table()


def vm() -> str:
    return str(uuid.uuid4())


def test_partition_is_the_contracts():
    assert partition_of("0000000a-0000-0000-0000-000000000000") == "id02"
    assert partition_of("ffffffff-0000-0000-0000-000000000000") == f"id{0xFFFFFFFF % 8:02d}"


def test_save_get_round_trip_with_wrapped_keys(store):
    vm_id = vm()
    key = CallbackKey.generate()
    saved = store.save(Identity(facts=facts(vm_id), keys=(key,)))
    assert saved.etag
    loaded = store.get(vm_id.upper())
    assert loaded == saved
    entity = store.table.get_entity(partition_of(vm_id), vm_id)
    assert key.secret.hex() not in json.dumps(dict(entity), default=str)
    assert entity["key_id"] == key.key_id and entity["name"] == "vm1"
    assert store.get(vm()) is None


def test_writes_are_etag_conditional(store):
    vm_id = vm()
    first = store.save(Identity(facts=facts(vm_id)))
    with pytest.raises(ResourceExistsError):
        store.save(Identity(facts=facts(vm_id)))  # an insert over an existing row
    second = store.save(first.model_copy(update={"facts": facts(vm_id, address="10.0.0.5")}))
    with pytest.raises(ResourceModifiedError):
        store.save(first)  # the version read before the other write
    assert store.get(vm_id).facts.address == "10.0.0.5" and second.etag != first.etag


def test_remember_key_keeps_two_and_never_drops_the_anchor_for_an_unproven_key(store):
    """Issue 46: unproven keys (a reimage, or any local process with an attested
    document) replace one another beside the anchor, the key proven to be the relay's; a
    key the anchor proves (the relay's rotation) becomes the anchor."""
    vm_id = vm()
    store.save(Identity(facts=facts(vm_id)))
    k1, k2, k3, k4, k5 = (CallbackKey.generate() for _ in range(5))
    assert store.remember_key(vm_id, k1).keys == (k1,)
    assert store.remember_key(vm_id, k2).keys == (k2, k1)
    again = store.remember_key(vm_id, k2)
    assert again.keys == (k2, k1)
    # The previous key presented again (an older message delivered late): no change.
    assert store.remember_key(vm_id, k1).keys == (k2, k1)
    assert store.remember_key(vm_id, k3).keys == (k3, k1)  # k1: the row's first key
    assert store.get(vm_id).anchor == k1.key_id
    proved = KeyProof(k1.key_id, key_proof(k1.secret, k4.key_id))
    assert store.remember_key(vm_id, k4, proved).keys == (k4, k1)
    assert store.remember_key(vm_id, k5).keys == (k5, k4)
    loaded = store.get(vm_id)
    assert loaded.current_key == k5 and loaded.anchor == k4.key_id
    assert loaded.key(k1.key_id) is None


def test_a_proof_counts_only_by_the_anchor_and_a_bad_one_is_refused(store):
    vm_id = vm()
    store.save(Identity(facts=facts(vm_id)))
    relay, other, new = (CallbackKey.generate() for _ in range(3))
    store.remember_key(vm_id, relay)
    identity = store.remember_key(vm_id, other)  # held, but not the anchor
    assert not identity.proved(new.key_id, None)
    assert not identity.proved(
        new.key_id, KeyProof(other.key_id, key_proof(other.secret, new.key_id))
    )
    unheld = CallbackKey.generate()
    assert not identity.proved(
        new.key_id, KeyProof(unheld.key_id, key_proof(unheld.secret, new.key_id))
    )
    assert identity.proved(new.key_id, KeyProof(relay.key_id, key_proof(relay.secret, new.key_id)))
    with pytest.raises(ForgedProof, match="does not verify"):
        identity.proved(new.key_id, KeyProof(relay.key_id, key_proof(other.secret, new.key_id)))
    with pytest.raises(ForgedProof):
        store.remember_key(vm_id, new, KeyProof(relay.key_id, "0" * 64))
    assert store.get(vm_id).key(new.key_id) is None


def test_a_row_from_before_the_anchor_takes_its_current_key_as_the_anchor(store):
    vm_id = vm()
    old, previous, new = (CallbackKey.generate() for _ in range(3))
    store.save(Identity(facts=facts(vm_id), keys=(old, previous), attested=(old.key_id,)))
    identity = store.get(vm_id)
    assert identity.anchor == "" and identity.anchor_key == old
    proved = KeyProof(old.key_id, key_proof(old.secret, new.key_id))
    rotated = store.remember_key(vm_id, new, proved)
    assert rotated.keys == (new, old) and rotated.anchor == new.key_id


def test_remember_key_needs_facts_first(store):
    with pytest.raises(LookupError):
        store.remember_key(vm(), CallbackKey.generate())


def test_keys_wrapped_under_another_app_secret_are_dropped_not_fatal(store):
    vm_id = vm()
    store.save(Identity(facts=facts(vm_id), keys=(CallbackKey.generate(),)))
    other = IdentityStore(store.table, b"X" * 40)
    loaded = other.get(vm_id)
    assert loaded is not None and loaded.keys == ()


def test_by_name_finds_one_and_refuses_ambiguity(store):
    a, b, c = vm(), vm(), vm()
    store.save(Identity(facts=facts(a, name="Alpha")))
    store.save(Identity(facts=facts(b, name="twin")))
    store.save(Identity(facts=facts(c, name="twin")))
    assert store.by_name("alpha").vm_id == a
    assert store.by_name("twin") is None
    assert store.by_name("nobody") is None


class CountingResolver(StaticResolver):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def resolve(self, vm_id: str) -> VmFacts:
        self.calls += 1
        return super().resolve(vm_id)


def test_cached_resolver_asks_azure_only_when_missing_stale_or_keyed_anew(store):
    vm_id = vm()
    upstream = CountingResolver()
    now = [T0]
    cache = CachedResolver(store, upstream, max_age_seconds=3600, clock=lambda: now[0])
    with pytest.raises(UnknownVm):
        cache.resolve(vm_id)
    upstream.register(facts(vm_id, at=T0))
    k1, k2 = CallbackKey.generate(), CallbackKey.generate()
    first = cache.enroll(vm_id, k1)
    assert first.keys == (k1,) and upstream.calls == 2
    assert cache.enroll(vm_id, k1) == first and upstream.calls == 2  # cached
    assert cache.resolve(vm_id) == first.facts and upstream.calls == 2
    # A new key: facts re-resolved and the key rotated in, in one write.
    upstream.register(facts(vm_id, at=T0, address="10.0.0.9"))
    second = cache.enroll(vm_id, k2)
    assert second.keys == (k2, k1) and second.facts.address == "10.0.0.9"
    assert upstream.calls == 3
    # Stale: refreshed, keys kept.
    now[0] = T0 + timedelta(hours=2)
    upstream.register(facts(vm_id, at=now[0], address="10.0.0.10"))
    assert cache.resolve(vm_id).address == "10.0.0.10" and upstream.calls == 4
    assert store.get(vm_id).keys == (k2, k1)


def test_cached_resolver_takes_a_vm_id_in_any_case_and_refuses_a_malformed_one(store):
    """A vmId reaches the table's key as normalise_vm_id gives it, whatever its case: one
    row, keys written beside its facts; anything but a UUID is refused (ValueError) before
    Resource Graph is asked or anything is written."""
    vm_id = vm()
    upstream = CountingResolver()
    upstream.register(facts(vm_id))
    cache = CachedResolver(store, upstream, max_age_seconds=3600, clock=lambda: T0)
    k1, k2 = CallbackKey.generate(), CallbackKey.generate()
    assert cache.enroll(vm_id.upper(), k1).keys == (k1,)
    assert cache.resolve(vm_id.upper()).vm_id == vm_id
    store.save(Identity(facts=facts(other := vm())))  # the sync's row: facts, no key yet
    assert cache.enroll(other.upper(), k2).keys == (k2,)
    assert [e["RowKey"] for e in store.table.list_entities()].count(vm_id) == 1
    calls = upstream.calls
    for bad in ("{" + vm_id + "}", vm_id.replace("-", ""), "urn:uuid:" + vm_id, "' or 1 eq 1"):
        with pytest.raises(ValueError, match="not a UUID"):
            cache.enroll(bad, CallbackKey.generate())
        with pytest.raises(ValueError, match="not a UUID"):
            cache.resolve(bad)
    assert upstream.calls == calls and len(list(store.table.list_entities())) == 2


def test_cached_resolver_passes_transient_failures_through(store):
    class Down:
        def resolve(self, vm_id: str) -> VmFacts:
            raise FactsUnavailable("throttled", retry_after=2)

    with pytest.raises(FactsUnavailable) as info:
        CachedResolver(store, Down()).enroll(vm(), CallbackKey.generate())
    assert info.value.retry_after == 2


def test_a_throttled_refresh_keeps_known_facts_and_waits_before_asking_again(store):
    """Resource Graph throttles (about 15 queries in 5 s per identity): a VM Azure described
    before keeps its facts and its new key is stored, instead of its messages being retried
    until they dead-letter; Resource Graph is asked again only after its Retry-After."""
    vm_id = vm()
    now = [T0]
    upstream = CountingResolver()
    upstream.register(facts(vm_id, at=T0))
    cache = CachedResolver(store, upstream, max_age_seconds=3600, clock=lambda: now[0])
    k1, k2 = CallbackKey.generate(), CallbackKey.generate()
    cache.enroll(vm_id, k1)
    calls = upstream.calls

    def throttled(asked: str) -> VmFacts:
        upstream.calls += 1
        raise FactsUnavailable("429 throttled", retry_after=30)

    upstream.resolve = throttled  # type: ignore[method-assign]
    now[0] = T0 + timedelta(hours=2)  # facts stale
    kept = cache.enroll(vm_id, k2)  # a rotated key, while Resource Graph throttles
    assert kept.facts.fetched_at == T0 and kept.keys == (k2, k1)
    assert store.get(vm_id).keys == (k2, k1)
    assert upstream.calls == calls + 1
    now[0] += timedelta(seconds=10)
    assert cache.enroll(vm_id, k2) == kept and upstream.calls == calls + 1  # put off
    now[0] += timedelta(seconds=30)
    cache.enroll(vm_id, k2)
    assert upstream.calls == calls + 2  # asked again after Retry-After
    # A VM Azure never described still waits (its message is retried, not guessed).
    with pytest.raises(FactsUnavailable):
        cache.enroll(str(uuid.uuid4()), CallbackKey.generate())
