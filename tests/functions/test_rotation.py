"""APP_SECRET rotation without restarts of the relays: with APP_SECRET_PREVIOUS set, a
relay's stored callback key still opens (and is wrapped under the new secret the first time
it is read), so no relay callback fails; approval forms opened before the rotation still
work. Without it, the rotation breaks the callback (the behaviour issue 28 found)."""

from __future__ import annotations

import pytest
import requests

from functions.clock import SystemClock
from functions.identity.attestation import AttestationVerifier
from functions.identity.registry import CachedResolver, IdentityStore
from functions.pipeline.admission import Admission
from functions.pipeline.context import Pipeline
from functions.pipeline.publish import LocalPublisher
from functions.settings import SettingsInvalid, load_settings
from simulator import identity as azure
from tests import identity_harness
from tests.functions.conftest import make_pipeline, make_settings
from tests.functions.test_real_relay import fleet, report  # noqa: F401 - the real relays
from tests.web.server import serve
from tests.web.test_pages import PAGES_ON, held, open_page, post, principal  # noqa: F401

OLD = identity_harness.APP_SECRET  # what every test relay's key was stored under
NEW = b"rotated-app-secret-9876543210fedcba-9876543210"


def admission(store, secret: bytes, previous: bytes | None = None) -> Admission:
    """The app's admission step on a host started with these secrets."""
    registry = IdentityStore.from_service(
        store.service, secret, store.prefix, previous=previous
    ).ensure_table()
    return Admission(
        verifier=AttestationVerifier(roots_pem=azure.test_issuer().root_pem),
        identities=CachedResolver(registry, identity_harness.RESOLVER),
        callback_port=identity_harness.CALLBACK_PORT,
    )


def host(store, secret: bytes, previous: bytes | None = None) -> tuple[Pipeline, LocalPublisher]:
    publisher = LocalPublisher()
    overrides = {"app_secret": secret.decode(), "approval_budget_seconds": 2}
    if previous is not None:
        overrides["app_secret_previous"] = previous.decode()
    pipeline = Pipeline(
        store,
        make_settings(**overrides),
        publisher,
        requests.Session(),
        SystemClock(),
        admission=admission(store, secret, previous),
    )
    return pipeline, publisher


def enrol_vm2_before_the_rotation(store, fleet):  # noqa: F811
    """vm2's relay sends once while the app runs with the old secret: its key is stored
    wrapped under it. vm2 then stays quiet."""
    sim, relays = fleet
    before, _ = host(store, OLD)
    report(before, sim, relays, "vm2", 1)
    vm2 = identity_harness.vm_id("vm2")
    assert before.admission.registry.get(vm2).current_key is not None
    return sim, relays, vm2


def test_a_rotation_with_the_previous_secret_fails_no_callback(store, fleet):  # noqa: F811
    sim, relays, vm2 = enrol_vm2_before_the_rotation(store, fleet)
    # The host restarts with APP_SECRET=new, APP_SECRET_PREVIOUS=old. A Reboot for both
    # VMs; only vm1 reports it (its relay holds a key the app never learnt: 401), so the
    # approval must go through vm2's relay, with the key stored before the rotation.
    event_id = sim.add_event("Reboot", resources=["vm1", "vm2"], source="User")
    after, _ = host(store, NEW, previous=OLD)
    report(after, sim, relays, "vm1", 1)
    record = store.get_event(event_id)
    assert record.approval == "approved" and record.approved_by == "vm2"
    assert [(a.vm, a.event_id) for a in sim.approvals] == [("vm2", event_id)]
    # vm2's row now opens under the new secret alone: the previous one can go.
    assert after.admission.registry.rewrapped == 1
    alone = IdentityStore.from_service(store.service, NEW, store.prefix)
    assert alone.get(vm2).current_key is not None
    assert alone.rewrapped == 0


def test_without_the_previous_secret_the_rotation_breaks_the_callback(store, fleet):  # noqa: F811
    """The control: the same rotation without APP_SECRET_PREVIOUS."""
    sim, relays, vm2 = enrol_vm2_before_the_rotation(store, fleet)
    event_id = sim.add_event("Reboot", resources=["vm1", "vm2"], source="User")
    after, _ = host(store, NEW)
    assert after.admission.registry.get(vm2).current_key is None  # unusable now
    report(after, sim, relays, "vm1", 1)
    assert store.get_event(event_id).approval != "approved"
    assert sim.approvals == []


def test_the_settings_carry_the_previous_secret_to_admission(store):
    settings = load_settings(app_secret=NEW.decode(), app_secret_previous=OLD.decode())
    assert settings.app_secret_previous_bytes == OLD
    built = Admission.from_settings(settings, store, requests.Session(), credential=None)
    assert built.registry.previous == OLD
    same = load_settings(app_secret=NEW.decode(), app_secret_previous=NEW.decode())
    assert same.app_secret_previous_bytes is None  # nothing to fall back to
    assert len(same.page_token_keys) == 2 and same.page_token_keys[0] == same.page_token_key


@pytest.mark.parametrize(
    "value",
    ["short", "@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/app-secret-old)"],
)
def test_an_unusable_previous_secret_stops_the_app_naming_it(value):
    with pytest.raises(SettingsInvalid, match=r"app_secret_previous|APP_SECRET_PREVIOUS"):
        load_settings(app_secret=NEW.decode(), app_secret_previous=value)


def test_a_form_opened_before_the_rotation_is_accepted(held, store, clock):  # noqa: F811
    pipeline, _ = held
    alice = principal()
    with serve(pipeline) as url:
        token, cookie, _ = open_page(url, alice)
    rotated, _ = make_pipeline(
        store,
        clock,
        **{**PAGES_ON, "app_secret": NEW.decode(), "app_secret_previous": PAGES_ON["app_secret"]},
    )
    with serve(rotated) as url:
        assert post(url, alice, token, cookie).status_code == 200


def test_a_rotation_costs_one_write_per_vm_once(azurite):
    """Measured on the wire: a row under the previous secret costs its read and one
    conditional write (the re-wrap) the first time; every later read is the read alone."""
    from azure.data.tables import TableServiceClient

    from functions.identity.keys import CallbackKey
    from functions.identity.registry import Identity
    from tests.tablecount import TableCounter

    with TableCounter(azurite) as counter:
        service = TableServiceClient.from_connection_string(counter.connection_string)
        prefix = "rot" + identity_harness.vm_id("vm9")[:8]
        before = IdentityStore.from_service(service, OLD, prefix).ensure_table()
        facts = identity_harness.facts_for("vm9", callback_url="http://127.0.0.1:1")
        before.save(Identity(facts=facts, keys=(CallbackKey.generate(),)))
        after = IdentityStore.from_service(service, NEW, prefix, previous=OLD)
        counter.reset()
        assert after.get(facts.vm_id).current_key is not None
        first = dict(counter.by_kind())
        counter.reset()
        assert after.get(facts.vm_id).current_key is not None
        assert (first, dict(counter.by_kind())) == ({"get": 1, "update": 1}, {"get": 1})
