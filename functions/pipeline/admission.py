"""Who sent a relay message, in Azure's words: the step before anything reads its content.

Every relay shares a Service Bus send right (and, on scale sets, an identity), and Service
Bus tells a receiver nothing about the sender, so a message's own claims (`vm.name`, its
sets, its resource id, its callback URL) are an attacker's input about every other VM. What
the app believes instead:

- the attested document IMDS signed for this very message (its nonce is the message's
  hash), which names the VM's `vmId` (functions.identity.attestation);
- what Azure Resource Graph says that vmId is: name, sets, resource id, private address
  (functions.identity.facts), kept in the app's own `identities` table;
- the relay's callback key, taken from an attested message only, wrapped with the app's
  own secret before it is stored (functions.identity.keys).

The message's VM reference is then replaced by one built from those facts, so everything
after this step (lifecycle, capacity, approval) sees Azure's view of the VM, and the VM can
speak only for itself.

ATTESTATION_MODE=report (a rollout, or a mismatch with Azure found in production) only
reports (issue 32): a message whose attested document fails is logged (WARNING "would
reject", naming the check) and counted (functions.pipeline.admission_tally: the fleet
page, the `admission` log line) in both modes, and it gains no power over any VM but the
one that holds the key it carries:

- it is admitted only as the vmId it claims AND only if it carries that VM's current
  callback key (id and secret), enrolled earlier by an attested message. Only that VM's
  relay holds the key (made on the VM, 0600), so such a message speaks for its own VM,
  as an attested one would: a VM enrolled before a mismatch keeps working through it;
- anything else (a VM never enrolled, another key, a key an older release let an
  unverified message plant) is rejected with the reason, as enforce would: it never
  enrols or replaces a key, never counts as any VM's view (no event, drain or approval),
  and costs one Table read, no Resource Graph query and no wait.

An attestation that cannot be checked *now* (AttestationUnavailable: an issuer fetch
failed, within the message's one deadline) is retried in both modes, never rejected.

What one message may cost before it is admitted or rejected (tests/security/
test_message_budget.py measures it for every hostile kind): the attestation check (parse,
the signed JSON's checks, one RSA verify, chain building bounded by the verifier's
signature budget, at most 2 issuer fetches under one 5 s deadline); then, only once
attested, at most one Resource Graph query (a VM's facts missing or stale, or a key new
to it and not proved by its relay's previous key, at most MAX_NEW_KEYS_PER_VM_DAY a day)
and at most one identities write; a rejection costs one `rejected` row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import requests

from functions.identity.attestation import (
    AttestationError,
    AttestationUnavailable,
    AttestationVerifier,
)
from functions.identity.facts import (
    FactsUnavailable,
    ResourceGraphRefused,
    ResourceGraphResolver,
    UnknownVm,
    VmFacts,
)
from functions.identity.graph_state import log_refusal_once
from functions.identity.keys import (
    CallbackKey,
    InvalidCallbackKey,
    parse_callback_key,
    parse_key_proof,
)
from functions.identity.registry import (
    CachedResolver,
    ForgedProof,
    Identity,
    IdentityStore,
    TooManyKeys,
)
from functions.model.envelope import Envelope, VmRef
from functions.pipeline.admission_tally import AdmissionTally, Unverified
from functions.pipeline.anchor import callback_url
from functions.settings import Settings
from functions.store.state import Store

log = logging.getLogger(__name__)

__all__ = [
    "Admission",
    "AttestationError",
    "FactsUnavailable",
    "NotAdmitted",
    "callback_url",
    "trusted_ref",
]


# A VM Resource Graph does not know yet (it lags new VMs by about a minute): each delivery
# waits this long before it is abandoned; once the message is UNKNOWN_VM_PATIENCE old it is
# rejected with the reason instead. Service Bus redelivers at once, so the patience must end
# before the last of maxDeliveryCount (10) deliveries: 9 waits of 15 s outlast 2 min, and
# the message is rejected with the reason instead of dead-lettered without one
# (tests/functions/test_admission.py ties these to the Bicep's maxDeliveryCount).
UNKNOWN_VM_WAIT_SECONDS = 15.0
UNKNOWN_VM_PATIENCE = timedelta(minutes=2)
# Resource Graph refusing the query (4xx: a configuration error, announced by the sync):
# a VM it never described waits this long per delivery, and is rejected with Azure's words
# once the message is CONFIG_ERROR_PATIENCE old: fewer deliveries than maxDeliveryCount
# (10), so it is a reasoned rejection, never a dead-letter; fixed before then, nothing lost.
CONFIG_ERROR_WAIT_SECONDS = 60.0
CONFIG_ERROR_PATIENCE = timedelta(minutes=8)

ENFORCE, REPORT = "enforce", "report"


class NotAdmitted(ValueError):
    """A message that proves no identity Azure vouches for: rejected with this reason."""


def trusted_ref(facts: VmFacts, port: int) -> VmRef:
    """The VM as Azure describes it, in the shape the rest of ingest reads."""
    return VmRef(
        name=facts.name,
        vm_id=facts.vm_id,
        callback_url=callback_url(facts, port),
        scale_set=facts.scale_set,
        availability_set=facts.availability_set,
        resource_id=facts.resource_id,
        subscription_id=facts.subscription_id,
        resource_group=facts.resource_group,
        tags=dict(facts.tags),
    )


@dataclass
class Admission:
    """Binds a relay message to its VM. One per pipeline; its state is the identities table."""

    verifier: AttestationVerifier
    identities: CachedResolver  # Resource Graph's facts, cached in the identities table
    callback_port: int = 8492
    sleep: Callable[[float], None] = time.sleep
    mode: str = ENFORCE  # ATTESTATION_MODE
    tally: AdmissionTally = field(default_factory=AdmissionTally)

    @property
    def registry(self) -> IdentityStore:
        return self.identities.store

    @classmethod
    def from_settings(
        cls, settings: Settings, store: Store, session: requests.Session, credential: Any
    ) -> Admission:
        """As deployed: Azure's roots (unless ATTESTATION_CA_PEM, the simulator's), Resource
        Graph with the app's identity, the identities table keyed by APP_SECRET."""
        secret = settings.app_secret_bytes
        if secret is None:
            raise ValueError("APP_SECRET is not set: relays' callback keys cannot be stored")
        registry = IdentityStore.from_service(
            store.service,
            secret,
            settings.state_table_prefix,
            previous=settings.app_secret_previous_bytes,
        ).ensure_table()
        resolver = ResourceGraphResolver(
            session,
            credential,
            settings.arm_endpoint,
            subscriptions=tuple(sorted(settings.subscription_allow_list)),
        )
        verifier = AttestationVerifier(
            roots_pem=settings.attestation_ca_pem or None,
            signer_suffixes=settings.signer_suffixes,
            allowed_subscriptions=settings.subscription_allow_list,
        )
        cached = CachedResolver(
            registry,
            resolver,
            max_age_seconds=settings.vm_facts_max_age_seconds,
            max_new_keys_per_day=settings.max_new_keys_per_vm_day,
        )
        return cls(
            verifier,
            cached,
            settings.relay_callback_port,
            mode=settings.attestation_mode,
            tally=AdmissionTally(table=store.events),
        )

    def admit(
        self, body: bytes | str, envelope: Envelope, now: datetime, *, patient: bool = True
    ) -> VmRef:
        """The sender as Azure describes it (its facts fresh enough, its current key
        remembered), in the shape the rest of ingest reads: the message's own VM
        reference is replaced by this one.

        Raises NotAdmitted (reject the message, with the reason) or FactsUnavailable
        (Resource Graph down, throttled or not yet showing a new VM, or the attestation
        cannot be checked now: retry later; `patient` waits a little first for a VM Resource
        Graph does not show yet). Each admission and rejection is counted."""
        unverified: list[Unverified] = []
        try:
            identity = self._admit(body, envelope, now, patient, unverified)
        except NotAdmitted:
            self.tally.count("rejected", now, unverified[0] if unverified else None)
            raise
        self.tally.count("admitted", now, unverified[0] if unverified else None)
        return trusted_ref(identity.facts, self.callback_port)

    def _admit(
        self,
        body: bytes | str,
        envelope: Envelope,
        now: datetime,
        patient: bool,
        unverified: list[Unverified],
    ) -> Identity:
        if envelope.attestation is None:
            raise NotAdmitted(
                "attestation: missing (relays older than per-VM identity send none; "
                "update the relay)"
            )
        if envelope.vm.vm_id is None:
            raise NotAdmitted("attestation: vm.vm_id is missing")
        if envelope.callback_key is None:
            raise NotAdmitted("callback_key is missing: the app could not call this relay")
        try:
            key = parse_callback_key(envelope.callback_key.model_dump())
            proof = parse_key_proof(envelope.callback_key.model_dump())
        except InvalidCallbackKey as exc:
            raise NotAdmitted(f"callback_key: {exc}") from None
        try:
            attested = self.verifier.verify(body, now)
        except AttestationUnavailable as exc:
            raise FactsUnavailable(f"attestation cannot be checked now: {exc}") from None
        except AttestationError as exc:
            # Report mode, the document failed: only its own VM's key admits it.
            failed = self._unverified(exc, envelope.vm.vm_id, now)
            unverified.append(failed)
            identity = self._by_own_key(key, failed)
        else:
            try:
                identity = self.identities.enroll(attested.vm_id, key, proof)
            except (TooManyKeys, ForgedProof, ResourceGraphRefused, UnknownVm) as exc:
                self._not_enrolled(exc, attested.vm_id, now - envelope.observed_at, patient)
                raise
            facts = identity.facts
            if facts.subscription_id.casefold() != attested.subscription_id.casefold():
                raise NotAdmitted(
                    f"attestation: subscription {attested.subscription_id} does not match "
                    f"Resource Graph's {facts.subscription_id} for vmId {attested.vm_id}"
                )
        _note_claims(envelope.vm.name, identity.facts)
        return identity

    def _not_enrolled(self, exc: Exception, vm_id: str, age: timedelta, patient: bool) -> None:
        """Why an attested VM could not be enrolled: NotAdmitted (reject, with the reason)
        or FactsUnavailable (retry later); returns when `exc` itself is to be raised again.
        `age`: the message's; `patient` waits a little first."""
        if isinstance(exc, (TooManyKeys, ForgedProof)):
            raise NotAdmitted(str(exc)) from None
        if isinstance(exc, ResourceGraphRefused):
            log_refusal_once(exc)
            if age > CONFIG_ERROR_PATIENCE:
                raise NotAdmitted(
                    f"vmId {vm_id}: Resource Graph refused the app's query for "
                    f"{int(age.total_seconds() // 60)} min ({exc.status} {exc.code}: "
                    f"{exc.message[:300]}): a configuration error to fix (the app identity's "
                    "Reader role on vmScopes, ALLOWED_SUBSCRIPTIONS)"
                ) from None
            if patient:
                self.sleep(CONFIG_ERROR_WAIT_SECONDS)
            return
        # UnknownVm: Resource Graph lags a new VM by about a minute: retry, slowly (Service
        # Bus redelivers at once, and 10 quick deliveries would dead-letter a VM's first
        # document). Long after the message, the VM is not coming: rejected, saying why.
        if age > UNKNOWN_VM_PATIENCE:
            raise NotAdmitted(
                f"vmId {vm_id} is not in Resource Graph "
                f"{int(age.total_seconds() // 60)} min after this message: is the app's "
                "identity Reader on the VM's resource group (vmScopes), and its "
                "subscription in ALLOWED_SUBSCRIPTIONS?"
            ) from None
        if patient:
            self.sleep(UNKNOWN_VM_WAIT_SECONDS)
        raise FactsUnavailable(f"Resource Graph does not know vmId yet: {exc}") from None

    def _by_own_key(self, key: CallbackKey, failed: Unverified) -> Identity:
        """Report mode, a document that failed: the VM it claims, if the message carries
        that VM's current key from an attested message; else NotAdmitted. One Table read;
        no Resource Graph query, no wait, no write."""
        known = self.registry.get(failed.vm_id)
        if known is not None and known.attested_key(key):
            log.warning(
                "ATTESTATION_MODE=report: vmId %s admitted by its enrolled callback key %s "
                "although its attested document failed check %r (enforce would reject it)",
                failed.vm_id,
                key.key_id,
                failed.check,
            )
            return known
        if known is None or known.current_key is None:
            why = "this vmId has no callback key from an attested message"
        elif known.current_key.key_id != key.key_id:
            why = f"the message carries key {key.key_id}, not the VM's key"
        else:
            why = "the VM's key did not come with an attested message"
        raise NotAdmitted(
            f"{failed.reason} (ATTESTATION_MODE=report admits such a message only with its "
            f"VM's enrolled callback key: {why})"
        )

    def _unverified(self, exc: AttestationError, claimed: str | None, now: datetime) -> Unverified:
        """A message whose attested document fails the check: NotAdmitted, or, in report
        mode, logged with the check and noted to count."""
        if self.mode != REPORT:
            raise NotAdmitted(str(exc)) from None
        check = getattr(exc, "check", "format")
        vm_id = str(claimed).lower()
        log.warning(
            "ATTESTATION_MODE=report: would reject a message claiming vmId %s (check %r): %s",
            vm_id,
            check,
            exc,
        )
        return Unverified(vm_id, check, str(exc), now)


def _note_claims(claimed: str, facts: VmFacts) -> None:
    """A relay's own words that differ from Azure's are logged, never used."""
    if claimed.casefold() != facts.name.casefold():
        log.warning(
            "vmId %s says it is %r; Azure says %r (Azure's name is used)",
            facts.vm_id,
            claimed[:128],
            facts.name,
        )
