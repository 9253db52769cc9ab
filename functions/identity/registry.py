"""The identities table (`{prefix}identities`): Azure's facts and the callback keys per VM.

Only the function app writes it (relays have no role on it), so everything in it is either
Azure's word (facts from Resource Graph) or learned from an attested message (keys). One
row per vmId: PartitionKey `id00`..`id07` (first 8 hex digits of the vmId mod 8, so no
partition holds the fleet), RowKey the vmId. Columns: `data` (the facts' JSON, bounded by
VmFacts' field limits), `keys` (JSON list of {"id", "wrapped"}, current first, at most 2),
`anchor` (the id of the key proven to be the VM's relay's: see Identity.anchor), plus
`name`, `key_id` and `fetched_at` for people browsing the table and for `by_name`.
Callback secrets are stored wrapped under APP_SECRET (keys.wrap): a reader of the table
cannot sign callbacks. Every write is conditional on the row's ETag (or an insert), so two
function instances never lose each other's key.
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import json
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableServiceClient, UpdateMode
from pydantic import BaseModel, ConfigDict

from functions.identity.facts import FactsResolver, FactsUnavailable, VmFacts, normalise_vm_id
from functions.identity.keys import CallbackKey, InvalidCallbackKey, KeyProof, unwrap, wrap

log = logging.getLogger(__name__)

TABLE_SUFFIX = "identities"
BUCKETS = 8
MAX_KEYS = 2  # current and previous
DEFAULT_MAX_AGE_SECONDS = 21600
WRITE_ATTEMPTS = 20


class IdentityConflict(RuntimeError):
    """The row kept changing under us; the caller may retry the message."""


class TooManyKeys(ValueError):
    """A VM presented more new callback keys today than MAX_NEW_KEYS_PER_VM_DAY: its
    message is rejected with this reason, before Resource Graph is asked."""


class ForgedProof(ValueError):
    """A key whose proof names a key the VM's row holds and does not verify with it: its
    message is rejected with this reason (never taken as a key without a proof)."""


DEFAULT_MAX_NEW_KEYS_PER_DAY = 4  # Settings.max_new_keys_per_vm_day


class Identity(BaseModel):
    """A VM's facts and callback keys (current first, then previous). `etag` is the row's
    as read or written (None: not stored yet); `save` writes only over that version."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    facts: VmFacts
    keys: tuple[CallbackKey, ...] = ()
    etag: str | None = None
    # "YYYY-MM-DD:N": keys new to a row that held others, presented that UTC day (issue 27:
    # each asks Resource Graph again; CachedResolver bounds them per VM-day).
    new_keys: str = ""
    # The id of the key proven to be this VM's relay's (issue 46): the row's first key, then
    # each key a proof by the anchor brought (the relay's rotation). Any local process can
    # send an attested message with a key of its own, but only the relay can prove a key
    # by the anchor: such a rotation is not counted against MAX_NEW_KEYS_PER_VM_DAY, and
    # the anchor stays held however many unproven keys arrive (Identity.with_key), so a
    # day of forged keys cannot lock the relay out. "" (a row written before it): the
    # current key is taken as the anchor.
    anchor: str = ""
    # Ids of the keys an attested message brought (issue 32). Only attested messages
    # enrol keys now, but a row an older release wrote in ATTESTATION_MODE=report may hold
    # a key an unverified message planted: such a key is never proof of the VM (report
    # mode's admission by key, functions.pipeline.admission) until an attested message
    # presents it again.
    attested: tuple[str, ...] = ()
    # An event approved through this VM's relay that never started in its own view, and
    # when that was found (functions.pipeline.relay_phase.suspect): its relay is not asked
    # again for a while. Kept here, beside the keys the approver reads anyway, so the
    # approver needs no VM row to honour it (issue 47).
    unstarted: str = ""
    unstarted_at: datetime | None = None

    def new_keys_on(self, day: str) -> int:
        when, _, count = self.new_keys.partition(":")
        return int(count) if when == day and count.isdigit() else 0

    @property
    def vm_id(self) -> str:
        return self.facts.vm_id

    @property
    def current_key(self) -> CallbackKey | None:
        return self.keys[0] if self.keys else None

    def key(self, key_id: str) -> CallbackKey | None:
        return next((k for k in self.keys if k.key_id == key_id), None)

    @property
    def anchor_key(self) -> CallbackKey | None:
        """The held key proven to be the relay's (None: the row holds no such key)."""
        return self.key(self.anchor) if self.anchor else self.current_key

    @property
    def unproven_current(self) -> bool:
        """Whether the current key is not the anchor: one no proof brought (a local user's,
        or a reimaged VM's new relay's: the app cannot tell which), beside the anchor. A
        row of before the anchor ("") is never in this state."""
        anchor, current = self.anchor_key, self.current_key
        return (
            bool(self.anchor)
            and anchor is not None
            and current is not None
            and anchor.key_id != current.key_id
        )

    @property
    def anchored_keys(self) -> tuple[CallbackKey, ...]:
        """The held keys, the anchor first: the key that speaks for the VM while its relay
        is alive (functions.pipeline.anchor). A row of before the anchor: as stored."""
        anchor = self.anchor_key
        if anchor is None:
            return self.keys
        return (anchor, *(k for k in self.keys if k.key_id != anchor.key_id))

    def proved(self, key_id: str, proof: KeyProof | None) -> bool:
        """Whether `proof` shows that the holder of the anchor made key `key_id`: the VM's
        own relay rotating. A proof by a key the row does not hold, or by a held key that
        is not the anchor (any key a local process sent is held too), proves nothing.
        Raises ForgedProof when the proof names a held key and does not verify with it."""
        prover = self.key(proof.previous_id) if proof is not None else None
        if prover is None or proof is None:
            return False
        if not proof.made(prover, key_id):
            raise ForgedProof(
                f"vmId {self.vm_id}: callback_key.proof for key {key_id} does not verify "
                f"with key {prover.key_id}, which this VM holds: rejected (a rotation is "
                "proved only by the relay's own previous key)"
            )
        anchor = self.anchor_key
        return anchor is not None and anchor.key_id == prover.key_id

    def attested_key(self, key: CallbackKey) -> bool:
        """Whether `key` (id and secret) is this VM's CURRENT key and came with an attested
        message: what only the VM's own relay can show (its key file is made on the VM)."""
        current = self.current_key
        return (
            current is not None
            and current.key_id == key.key_id
            and hmac.compare_digest(current.secret, key.secret)
            and key.key_id in self.attested
        )

    def with_key(self, key: CallbackKey, proof: KeyProof | None = None) -> Identity:
        """`key` as current, brought by an attested message (the only kind that enrols
        keys): a new id becomes current and the anchor (else the old current) becomes
        previous, so unproven keys replace one another, never the relay's proven key. A
        new key proved by the anchor (`proof`, see `proved`) becomes the anchor. A key
        already current, or the previous one presented again (an older message delivered
        late), changes nothing but its attested mark: a superseded key is never made
        current again."""
        if self.key(key.key_id) is not None:
            if key.key_id in self.attested:
                return self
            marked = {*self.attested, key.key_id}
            return self.model_copy(
                update={"attested": tuple(k.key_id for k in self.keys if k.key_id in marked)}
            )
        anchor = self.anchor_key
        kept = anchor or self.current_key
        keys = (key, kept) if kept is not None else (key,)
        if not self.keys or self.proved(key.key_id, proof):
            anchored = key.key_id
        else:
            anchored = anchor.key_id if anchor is not None else self.anchor
        marked = {*self.attested, key.key_id}
        return self.model_copy(
            update={
                "keys": keys,
                "attested": tuple(k.key_id for k in keys if k.key_id in marked),
                "anchor": anchored,
            }
        )


def partition_of(vm_id: str) -> str:
    return f"id{int(vm_id[:8], 16) % BUCKETS:02d}"


class IdentityStore:
    """Reads and writes identity rows through a TableClient passed in."""

    def __init__(
        self, table: TableClient, app_secret: bytes, previous: bytes | None = None
    ) -> None:
        self.table = table
        self.app_secret = app_secret
        # APP_SECRET_PREVIOUS during a rotation: keys wrapped under it still open, and the
        # row is written again under APP_SECRET when `get` reads it (once per VM).
        self.previous = previous if previous != app_secret else None
        self.rewrapped = 0

    @classmethod
    def from_service(
        cls,
        service: TableServiceClient,
        app_secret: bytes,
        prefix: str = "sebridge",
        previous: bytes | None = None,
    ) -> IdentityStore:
        return cls(service.get_table_client(f"{prefix}{TABLE_SUFFIX}"), app_secret, previous)

    def ensure_table(self) -> IdentityStore:
        with contextlib.suppress(ResourceExistsError):
            self.table.create_table()
        return self

    # ------------------------------------------------------------------ rows

    def _entity(self, identity: Identity) -> dict[str, Any]:
        facts = identity.facts
        keys = [
            {"id": k.key_id, "wrapped": wrap(self.app_secret, k)} for k in identity.keys[:MAX_KEYS]
        ]
        return {
            "PartitionKey": partition_of(facts.vm_id),
            "RowKey": facts.vm_id,
            "data": facts.model_dump_json(),
            "keys": json.dumps(keys, separators=(",", ":")),
            "name": facts.name.casefold(),
            "key_id": keys[0]["id"] if keys else "",
            "fetched_at": facts.fetched_at,
            "new_keys": identity.new_keys,
            "attested": ",".join(identity.attested),
            "anchor": identity.anchor,
            **(
                {"unstarted": identity.unstarted[:200], "unstarted_at": identity.unstarted_at}
                if identity.unstarted and identity.unstarted_at is not None
                else {}
            ),
        }

    def _load(self, entity: Any) -> Identity:
        return self._read(entity)[0]

    def _read(self, entity: Any) -> tuple[Identity, bool]:
        """The row's identity, and whether a key opened only under APP_SECRET_PREVIOUS."""
        facts = VmFacts.model_validate_json(entity["data"])
        keys = []
        stale = False
        for item in json.loads(entity.get("keys") or "[]")[:MAX_KEYS]:
            try:
                key, old = self._unwrap(item["wrapped"], item["id"])
            except (InvalidCallbackKey, KeyError, TypeError) as exc:
                # Another APP_SECRET (rotated without APP_SECRET_PREVIOUS?) or a damaged
                # row: the key is unusable; the relay's next message teaches it again.
                log.warning("identity %s: stored key not usable: %s", facts.vm_id, exc)
                continue
            keys.append(key)
            stale = stale or old
        identity = Identity(
            facts=facts,
            keys=tuple(keys),
            etag=entity.metadata.get("etag"),
            new_keys=str(entity.get("new_keys") or "")[:32],
            attested=tuple(i for i in str(entity.get("attested") or "").split(",")[:MAX_KEYS] if i),
            anchor=str(entity.get("anchor") or "")[:16],
            unstarted=str(entity.get("unstarted") or "")[:200],
            unstarted_at=at if isinstance(at := entity.get("unstarted_at"), datetime) else None,
        )
        return identity, stale

    def _unwrap(self, blob: str, key_id: str) -> tuple[CallbackKey, bool]:
        try:
            return unwrap(self.app_secret, blob, key_id), False
        except InvalidCallbackKey:
            if self.previous is None:
                raise
            return unwrap(self.previous, blob, key_id), True

    def get(self, vm_id: str) -> Identity | None:
        """The VM's row, if any. `vm_id` in any case: the table's one guard (anything but
        a UUID raises ValueError before it reaches a key)."""
        return self._get(normalise_vm_id(vm_id))

    def _get(self, vm_id: str) -> Identity | None:
        """The row keyed `vm_id`, as normalise_vm_id gives it."""
        try:
            entity = self.table.get_entity(partition_of(vm_id), vm_id)
        except ResourceNotFoundError:
            return None
        identity, stale = self._read(entity)
        return self._rewrap(identity) if stale else identity

    def _rewrap(self, identity: Identity) -> Identity:
        """The row written again with its keys under APP_SECRET (during a rotation, once
        per VM): after it, APP_SECRET_PREVIOUS is no longer needed for this VM. A row that
        changed meanwhile is left to its writer (every writer wraps under its APP_SECRET)."""
        try:
            saved = self.save(identity)
        except (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError):
            return identity
        self.rewrapped += 1
        log.info("identity %s: callback keys wrapped again under APP_SECRET", identity.vm_id)
        return saved

    def save(self, identity: Identity) -> Identity:
        """Insert (no ETag) or replace only the version read (ETag); returns the identity
        with its new ETag. Raises ResourceExistsError / ResourceModifiedError on a race."""
        entity = self._entity(identity)
        if identity.etag is None:
            meta = self.table.create_entity(entity)
        else:
            meta = self.table.update_entity(
                entity,
                mode=UpdateMode.REPLACE,
                etag=identity.etag,
                match_condition=MatchConditions.IfNotModified,
            )
        return identity.model_copy(update={"etag": meta.get("etag")})

    def mutate(
        self,
        vm_id: str,
        change: Callable[[Identity | None], Identity | None],
        known: Identity | bool | None = False,
    ) -> Identity | None:
        """Read-modify-write with the ETag; `change` may run several times (compute only).
        It returns the new identity, or None for "nothing to write". `vm_id`: as
        normalise_vm_id gives it (CachedResolver's). `known`: the row as just read (None:
        absent), saving the first read; the ETag still guards the write."""
        for attempt in range(WRITE_ATTEMPTS):
            if attempt == 0 and known is not False:
                current = known if isinstance(known, Identity) else None
            else:
                current = self._get(vm_id)
            updated = change(current)
            if updated is None:
                return current
            updated = updated.model_copy(update={"etag": current.etag if current else None})
            try:
                return self.save(updated)
            except (ResourceExistsError, ResourceModifiedError):
                time.sleep(random.uniform(0, min(0.2, 0.005 * 2**attempt)))  # noqa: S311
        raise IdentityConflict(f"identity {vm_id} kept changing")

    def remember_key(self, vm_id: str, key: CallbackKey, proof: KeyProof | None = None) -> Identity:
        """Make `key` the VM's current key (see Identity.with_key, `proof` its proof). The
        VM must have a row (facts first): a key is only ever stored beside Azure's facts.
        `vm_id`: as normalise_vm_id gives it."""

        def change(current: Identity | None) -> Identity | None:
            if current is None:
                raise LookupError(f"identity {vm_id} has no facts yet")
            updated = current.with_key(key, proof)
            return None if updated is current else updated

        result = self.mutate(vm_id, change)
        assert result is not None
        return result

    def by_name(self, name: str) -> Identity | None:
        """The identity whose facts name `name` (case-insensitive), if exactly one does:
        names repeat across resource groups and subscriptions, so two matches are no
        answer (the VM row holds the vm_id for that reason)."""
        query = self.table.query_entities(
            "name eq @name", parameters={"name": name.casefold()}, results_per_page=2
        )
        found = list(itertools.islice(query, 2))
        if len(found) != 1:
            if len(found) > 1:
                log.warning("identity: VM name %r is not unique; use its vm_id", name[:80])
            return None
        return self._load(found[0])


RECENT_IDENTITIES = 4096  # per worker: about 4 MB at most
REFRESH_RETRY_SECONDS = 60  # a refresh Resource Graph refused is put off this long


class CachedResolver:
    """A FactsResolver that keeps facts in the identities table: Resource Graph is asked
    only when the row is missing or older than `max_age` (VM_FACTS_MAX_AGE_SECONDS), or
    when the relay presents a key the row does not hold while it holds another (a reimaged
    or rebuilt VM). Rows the bulk sync wrote (facts, no key) take a VM's first key as is."""

    def __init__(
        self,
        store: IdentityStore,
        upstream: FactsResolver,
        max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS,
        clock: Callable[[], datetime] | None = None,
        max_new_keys_per_day: int = DEFAULT_MAX_NEW_KEYS_PER_DAY,
    ) -> None:
        self.store = store
        self.upstream = upstream
        self.max_age = timedelta(seconds=max_age_seconds)
        self.max_new_keys_per_day = max_new_keys_per_day
        self.clock = clock or (lambda: datetime.now(UTC))
        # Rows this worker last read or wrote, by vmId. Only the app writes the table, and a
        # row is reused only while its facts are fresh and it holds the presented key, so a
        # relay's steady messages cost no Table read; anything new (a key, stale facts)
        # goes to the table as before.
        self._recent: OrderedDict[str, Identity] = OrderedDict()
        # vmId -> when to ask Resource Graph again after it could not answer (throttled).
        self._refresh_after: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def _remember(self, identity: Identity) -> Identity:
        with self._lock:
            self._recent[identity.vm_id] = identity
            self._recent.move_to_end(identity.vm_id)
            while len(self._recent) > RECENT_IDENTITIES:
                self._recent.popitem(last=False)
        return identity

    def _fresh(self, identity: Identity | None) -> bool:
        return identity is not None and self.clock() - identity.facts.fetched_at < self.max_age

    def resolve(self, vm_id: str) -> VmFacts:
        """Facts from the table while fresh, else from upstream (stored, keys kept).
        Raises what upstream raises (FactsUnavailable, UnknownVm)."""
        vm_id = vm_id.lower()  # as rows are keyed: store.get refuses anything but a UUID
        identity = self.store.get(vm_id)
        if identity is not None and self._fresh(identity):
            return identity.facts
        return self._refresh(vm_id, None).facts

    def enroll(self, vm_id: str, key: CallbackKey, proof: KeyProof | None = None) -> Identity:
        """The facts and keys after an attested message from `vm_id` carrying `key` (and
        `proof`, its proof by the relay's previous key, if any): facts re-resolved if stale
        or if the key is new to the row and unproven, and the key remembered. Raises
        TooManyKeys (an unproven key over the day's bound) or ForgedProof."""
        vm_id = vm_id.lower()  # as rows are keyed: store.get refuses anything but a UUID
        with self._lock:
            recent = self._recent.get(vm_id)
            waiting = self._refresh_after.get(vm_id)
        if (
            recent is not None
            and key.key_id in recent.attested
            and (self._fresh(recent) or (waiting and self.clock() < waiting))
        ):
            return recent  # the steady case (or a refresh put off): no Table request
        identity = self.store.get(vm_id)
        if identity is not None and self._fresh(identity):
            if key.key_id in identity.attested:
                return self._remember(identity)  # one Table read, no Resource Graph query
            if identity.key(key.key_id):  # held, not marked yet (an older release's row)
                return self._remember(self.store.remember_key(vm_id, key))
            if not identity.keys:
                # Facts the bulk sync stored (functions.identity.sync) and no key yet: the
                # VM's first message. Its facts are fresh Azure facts, so its key is stored
                # beside them without asking Resource Graph (a fleet enrols by the page).
                return self._remember(self.store.remember_key(vm_id, key))
        # Missing, stale, or a key new to the row (reimage, re-creation: Azure's facts may
        # have changed with it): ask Azure, then store facts and key in one write. A VM
        # presenting more new keys today than the bound is refused before any query; a key
        # the relay proved by its anchor is its rotation: not counted, and facts still
        # fresh are kept (no query).
        if identity is not None and identity.keys and identity.key(key.key_id) is None:
            if identity.proved(key.key_id, proof):
                log.info(
                    "vmId %s: callback key %s proved by key %s (the relay's rotation)",
                    vm_id,
                    key.key_id,
                    proof.previous_id if proof else "",
                )
                if self._fresh(identity):
                    return self._remember(self.store.remember_key(vm_id, key, proof))
            else:
                self._within_bound(identity)
        try:
            return self._remember(self._refresh(vm_id, key, known=identity, proof=proof))
        except FactsUnavailable as exc:
            if identity is None:
                raise  # a VM Azure has not described yet: its message waits (retried)
            return self._remember(self._facts_kept(identity, key, proof, exc))

    def _within_bound(self, identity: Identity) -> None:
        """Raise TooManyKeys when `identity`'s VM brought its day's unproven new keys."""
        today = self.clock().strftime("%Y-%m-%d")
        if identity.new_keys_on(today) >= self.max_new_keys_per_day:
            raise TooManyKeys(
                f"vmId {identity.vm_id}: more than {self.max_new_keys_per_day} new "
                "callback keys today (MAX_NEW_KEYS_PER_VM_DAY) without a proof by the "
                "relay's previous key; the key it holds still works"
            )

    def _facts_kept(
        self, identity: Identity, key: CallbackKey, proof: KeyProof | None, exc: FactsUnavailable
    ) -> Identity:
        """Resource Graph throttled or down, and Azure described this vmId before: its
        facts (name, sets, address) seldom change, so they serve until the next message
        retries the refresh, rather than holding every enrolled VM's messages back (a
        fleet-wide wave of refreshes would otherwise dead-letter)."""
        vm_id = identity.vm_id
        log.warning(
            "vmId %s: facts not refreshed (%s); using those of %s",
            vm_id,
            exc,
            identity.facts.fetched_at.isoformat(),
        )
        kept = identity
        if key.key_id not in identity.attested:
            kept = self.store.remember_key(vm_id, key, proof)
        wait = timedelta(seconds=exc.retry_after or REFRESH_RETRY_SECONDS)
        with self._lock:
            self._refresh_after[kept.vm_id] = self.clock() + wait
            while len(self._refresh_after) > RECENT_IDENTITIES:
                self._refresh_after.pop(next(iter(self._refresh_after)))
        return kept

    def _refresh(
        self,
        vm_id: str,
        key: CallbackKey | None,
        known: Identity | bool | None = False,
        proof: KeyProof | None = None,
    ) -> Identity:
        facts = self.upstream.resolve(vm_id)
        today = self.clock().strftime("%Y-%m-%d")

        def change(current: Identity | None) -> Identity:
            base = current or Identity(facts=facts)
            updated = base.model_copy(update={"facts": facts})
            if key is None:
                return updated
            new = bool(base.keys) and base.key(key.key_id) is None
            if new and not base.proved(key.key_id, proof):  # a proved rotation: not counted
                count = base.new_keys_on(today) + 1
                updated = updated.model_copy(update={"new_keys": f"{today}:{count}"})
            return updated.with_key(key, proof)

        result = self.store.mutate(vm_id, change, known=known)
        assert result is not None
        return result
