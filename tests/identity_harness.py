"""Azure's side of identity for tests that build relay messages by hand.

Relay messages are admitted only with an IMDS attested document for their exact bytes
(functions.pipeline.admission), so a test's hand-made envelope is attested here the way a
relay does it: the binding nonce of the envelope without `attestation`, a document signed
by the simulator's test issuer (simulator.identity), which the test app trusts through its
`roots_pem` as the demo does through ATTESTATION_CA_PEM. What Resource Graph would say of
the VM is registered in a StaticResolver at the same time.

Each test VM has a stable vmId (uuid5 of its name) and a callback key derived from its name
and the relay URL it is given: a test that gives a VM another relay gets another key, as a
reinstalled relay would.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from functions.identity.attestation import AttestationVerifier, binding_nonces
from functions.identity.facts import StaticResolver, VmFacts
from functions.identity.keys import CallbackKey, key_id_of
from functions.identity.registry import CachedResolver, Identity, IdentityStore
from functions.pipeline.admission import Admission
from functions.store.state import Store
from simulator import identity as azure

SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"
RESOURCE_GROUP = "test-rg"
APP_SECRET = b"test-app-secret-0123456789abcdef-0123456789"
CALLBACK_PORT = 8492

RESOLVER = StaticResolver()  # shared: facts are registered as envelopes are made
NAMES: dict[str, str] = {}  # vmId -> name, for relay stand-ins that verify signatures
URLS: dict[str, str] = {}  # VM name (case-folded) -> the relay URL it was last given


def vm_id(name: str) -> str:
    vid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"test-vm/{name.casefold()}"))
    NAMES[vid] = name
    return vid


def callback_key(name: str, url: str | None = None) -> CallbackKey:
    secret = hashlib.sha256(f"test-callback/{name.casefold()}/{url or ''}".encode()).digest()
    return CallbackKey(key_id=key_id_of(secret), secret=secret)


def facts_for(
    name: str,
    *,
    callback_url: str | None = None,
    scale_set: str | None = None,
    availability_set: str | None = None,
    fetched_at: datetime | None = None,
) -> VmFacts:
    parts = urlsplit(callback_url) if callback_url else None
    group = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}"
    return VmFacts(
        vm_id=vm_id(name),
        name=name,
        resource_id=f"{group}/providers/Microsoft.Compute/virtualMachines/{name}",
        subscription_id=SUBSCRIPTION,
        resource_group=RESOURCE_GROUP,
        scale_set=scale_set,
        availability_set=availability_set,
        address=parts.hostname if parts else None,
        port=parts.port if parts else None,
        fetched_at=fetched_at or datetime.now().astimezone(),
    )


def with_resource_id(body: str, resource_id: str) -> str:
    """The same VM as Azure knows it under `resource_id` (a scale-set instance, a VM in
    another group): Resource Graph's answer changes, and the message is attested again."""
    data = json.loads(body)
    name = data["vm"]["name"]
    facts = RESOLVER.resolve(vm_id(name))
    group = resource_id.split("/providers/")[0]
    RESOLVER.register(
        facts.model_copy(
            update={"resource_id": resource_id, "resource_group": group.rsplit("/", 1)[-1]}
        )
    )
    data["vm"]["resource_id"] = resource_id
    return attest(data, datetime.fromisoformat(data["observed_at"]))


def attest(envelope: dict[str, Any], at: datetime, *, vm: str | None = None) -> str:
    """The envelope as a relay sends it: with its attested document (for `vm`'s vmId,
    by default the envelope's own claim)."""
    body = {k: v for k, v in envelope.items() if k != "attestation"}
    nonce = binding_nonces(body)[0]
    who = vm_id(vm) if vm else body["vm"]["vm_id"]
    # Valid from a day before the message for ten years: tests move their clocks freely
    # around a message's time (its freshness rules are tested in tests/identity).
    content = azure.attested_content(
        who, SUBSCRIPTION, nonce, now=at - timedelta(days=1), lifetime=timedelta(days=3650)
    )
    issuer = azure.test_issuer()
    signature = azure.sign(content, issuer.leaf, issuer.leaf_key)
    return json.dumps({**body, "attestation": {"signature": signature, "nonce": nonce}})


def signed_envelope(
    envelope: dict[str, Any],
    at: datetime,
    *,
    callback_url: str | None = None,
    scale_set: str | None = None,
    availability_set: str | None = None,
    key: CallbackKey | None = None,
) -> str:
    """Register Azure's facts for the envelope's VM, add its vmId and key, attest it.

    A VM's relay address is Azure's, not the message's: a message made without one keeps
    the address (and so the key) the VM was last given."""
    name = envelope["vm"]["name"]
    if callback_url is None:
        callback_url = URLS.get(name.casefold())
    else:
        URLS[name.casefold()] = callback_url
    RESOLVER.register(
        facts_for(
            name,
            callback_url=callback_url,
            scale_set=scale_set,
            availability_set=availability_set,
            fetched_at=at,
        )
    )
    key = key or callback_key(name, callback_url)
    envelope = {
        **envelope,
        "vm": {**envelope["vm"], "vm_id": vm_id(name)},
        "callback_key": {"id": key.key_id, "secret": key.secret.hex()},
    }
    return attest(envelope, at)


def admission(
    store: Store, clock: Callable[[], datetime] | None = None, *, ensure: bool = True
) -> Admission:
    """The app's admission step as deployed, trusting the simulator's issuer; `ensure`
    False where the identities table is known to exist (the crash explorer boots a host
    per run and per crash, over tables its world made)."""
    registry = IdentityStore.from_service(store.service, APP_SECRET, store.prefix)
    if ensure:
        registry.ensure_table()
    return Admission(
        verifier=AttestationVerifier(roots_pem=azure.test_issuer().root_pem),
        identities=CachedResolver(registry, RESOLVER, clock=clock),
        callback_port=CALLBACK_PORT,
    )


def enroll(pipeline: Any, name: str, target: Any, **facts: Any) -> str:
    """What an attested message from `target`'s relay would have left in the identities
    table: Azure's facts for `name` (its address: the target's) and the relay's keys."""
    known = facts_for(name, callback_url=target.url, **facts)
    known = known.model_copy(update={"vm_id": target.vm_id})
    registry = pipeline.admission.registry
    registry.save(Identity(facts=known, keys=tuple(target.keys)))
    return target.vm_id
