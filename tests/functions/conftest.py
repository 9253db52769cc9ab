"""Shared pieces: a fresh store per test on Azurite, a fake clock, signature-checking relays."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
from azure.data.tables import EdmType, EntityProperty, UpdateMode

from functions.clock import Clock
from functions.identity.keys import liveness_signature
from functions.model.policy import Policy, PolicyLoad, sample_rules
from functions.pipeline.context import Pipeline
from functions.pipeline.publish import LocalPublisher
from functions.settings import Settings
from functions.signing import SignatureError, verify_v2
from functions.store.liveness import DictVerifier, liveness_partition
from functions.store.state import Store
from tests import identity_harness

KEY = "test-relay-key-0123456789abcdef"
T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)


class FakeClock:
    """Time that moves only when told to, or when the code under test sleeps."""

    def __init__(self, start: datetime = T0) -> None:
        self.current = start
        self.slept: list[float] = []
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self.current

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept.append(seconds)
            self.current += timedelta(seconds=seconds)

    def advance(self, seconds: float) -> None:
        self.sleep(seconds)


class Relay:
    """A relay callback stand-in: verifies the signature exactly as the relay does (scheme
    v2: the key its VM's relay gave, naming that VM's vmId), answers from a script (then
    `default`), and records every verified request with the VM it was signed for."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, Any]]] = []
        self.default: tuple[int, dict[str, Any]] = (200, {"imds_status": 200})
        self.requests: list[dict[str, Any]] = []
        self.bad_signatures = 0
        self.seen: set[str] = set()
        # Extra keys a signature may verify under (a rotation), besides the VM's own; `own`
        # False: only these (a relay that has not got the key its VM's messages carry).
        self.keys: list[identity_harness.CallbackKey] = []
        self.own = True
        self.targets: list[str] = []  # the VM names requests were signed for
        # EventIds whose /v1/start is carried out (IMDS took StartRequests: recorded with
        # 200/200) but whose answer never comes: the connection closes unanswered, as a
        # relay's answer lost or too slow for the app's deadline (issue 45).
        self.drop: set[str] = set()
        # The app's clock, when a test gives it: each request is stamped with it ("when").
        self.clock: Callable[[], datetime] | None = None
        self._lock = threading.Lock()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                try:
                    given = relay.verify(dict(self.headers), self.path, body)
                    with relay._lock:  # the relay refuses a signature it has seen (replay)
                        if given in relay.seen:
                            raise SignatureError("replayed signature")
                        relay.seen.add(given)
                except SignatureError as exc:
                    with relay._lock:
                        relay.bad_signatures += 1
                    self._answer(401, {"error": str(exc)})
                    return
                sent = json.loads(body)
                ids = sent["EventIds"]
                with relay._lock:
                    status, answer = relay.script.pop(0) if relay.script else relay.default
                    relay.requests.append(
                        {
                            "path": self.path,
                            "EventIds": ids,
                            "Expect": sent.get("Expect"),
                            "AttemptId": sent.get("AttemptId"),
                            # What it answered (the crash explorer's invariants: a 200 with
                            # IMDS's 200 is a StartRequests that reached Azure).
                            "status": status,
                            "imds_status": answer.get("imds_status"),
                            "at": time.monotonic(),  # when it arrived (the bench's wave)
                            "when": relay.clock() if relay.clock else None,
                        }
                    )
                    relay.targets.append(identity_harness.NAMES.get(given_target(self), "?"))
                    dropped = bool(relay.drop & set(ids))
                    if dropped:
                        relay.requests[-1].update(status=200, imds_status=200, dropped=True)
                if dropped:
                    self.close_connection = True
                    return  # no answer at all: the client sees the connection close
                if status == 200 and "results" not in answer:
                    answer = {**answer, "results": dict.fromkeys(ids, "approved")}
                self._answer(status, answer)

            def _answer(self, status: int, answer: dict[str, Any]) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def given_target(handler: BaseHTTPRequestHandler) -> str:
            return handler.headers.get("X-Relay-Target", "")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def verify(self, headers: dict[str, str], path: str, body: bytes) -> str:
        """As the VM's relay would: the target names a test VM, and the key is the one that
        VM's relay (at this URL) gave in its attested messages, or one of `keys`."""
        target = {k.lower(): v for k, v in headers.items()}.get("x-relay-target", "")
        name = identity_harness.NAMES.get(target)
        if name is None:
            raise SignatureError("signed for a VM this relay does not serve")
        own = [identity_harness.callback_key(name, self.url)] if self.own else []
        keys = {k.key_id: k.secret for k in [*own, *self.keys]}
        return verify_v2(keys, target, headers, "POST", path, body)

    def starts(self) -> list[str]:
        return [i for r in self.requests for i in r["EventIds"]]

    def attempt_ids(self) -> list[str | None]:
        """The `AttemptId` of every verified /v1/start, in order (issue 31)."""
        return [r["AttemptId"] for r in self.requests if r["path"] == "/v1/start"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def new_relay() -> Iterator[Callable[[], Relay]]:
    started: list[Relay] = []

    def factory() -> Relay:
        relay = Relay()
        started.append(relay)
        return relay

    yield factory
    for relay in started:
        relay.close()


@pytest.fixture
def relay(new_relay: Callable[[], Relay]) -> Relay:
    return new_relay()


@pytest.fixture
def store(azurite: str) -> Store:
    prefix = "t" + uuid.uuid4().hex[:12]
    return Store.from_connection_string(azurite, prefix).ensure_tables()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_settings(policy: Policy | PolicyLoad | None = None, **overrides: Any) -> Settings:
    # Relays only unless a test says otherwise: every VM now has an ARM id (Azure's facts),
    # so "relay,arm" would hand over to ARM, which has no credential here.
    values: dict[str, Any] = {"approval_budget_seconds": 30, "approvers": "relay", **overrides}
    settings = Settings(**values)
    if isinstance(policy, Policy):
        policy = PolicyLoad(policy=policy)
    # Microsoft's sample (opt-in hold) unless a test says otherwise: these tests are about
    # the pipeline's mechanics, written against held Platform and approved User events.
    # The default policy (drain, then approve) has its own tests (test_policy.py,
    # test_default_drain.py).
    return settings.with_policy(policy or PolicyLoad(policy=Policy(rules=sample_rules())))


# Enrolled VMs for the tests' liveness verifier: vm_id -> (name, {key_id: secret}).
ENROLLED: dict[str, tuple[str, dict[str, bytes]]] = {}
VERIFIER = DictVerifier({})
VERIFIER.known = ENROLLED  # one registry, shared by every test pipeline


def vm_id_of(name: str) -> str:
    """The test VM's vmId: the one its attested messages carry (tests.identity_harness)."""
    return identity_harness.vm_id(name)


def liveness_key(name: str) -> tuple[str, bytes]:
    secret = hashlib.sha256(f"callback-key:{name.casefold()}".encode()).digest()
    return hashlib.sha256(secret).hexdigest()[:16], secret


def liveness_row(name: str, at: datetime, relay_version: str = "test") -> dict[str, Any]:
    """The row a relay writes for a heartbeat at `at` (contract §5), its VM enrolled."""
    vm_id = vm_id_of(name)
    key_id, secret = liveness_key(name)
    ENROLLED[vm_id] = (name, {key_id: secret})
    unix = int(at.timestamp())
    return {
        "PartitionKey": liveness_partition(vm_id),
        "RowKey": vm_id,
        "seen": datetime.fromtimestamp(unix, UTC),
        "at": EntityProperty(unix, EdmType.INT64),
        "relay_version": relay_version,
        "key_id": key_id,
        "sig": liveness_signature(secret, vm_id, unix, relay_version),
    }


def write_liveness(store: Store, name: str, at: datetime) -> None:
    """`name`'s relay writes its liveness row (Insert Or Merge, as relays do)."""
    store.liveness.table.upsert_entity(liveness_row(name, at), mode=UpdateMode.MERGE)


class Handed:
    """A work queue that keeps the keys handed to it (functions.pipeline.workqueue)."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def enqueue(self, keys: list[str], now: datetime, *, sweep: bool = False) -> int:
        self.keys += keys
        return len(keys)


def make_pipeline(
    store: Store, clock: Clock, policy: Policy | PolicyLoad | None = None, **overrides: Any
) -> tuple[Pipeline, LocalPublisher]:
    publisher = LocalPublisher()
    pipeline = Pipeline(
        store,
        make_settings(policy, **overrides),
        publisher,
        requests.Session(),
        clock,
        admission=identity_harness.admission(store, clock.now),
        liveness_verifier=VERIFIER,
    )
    return pipeline, publisher


def event(
    event_id: str = "EV-1",
    event_type: str = "Reboot",
    status: str = "Scheduled",
    resources: tuple[str, ...] = ("vm1",),
    not_before: datetime | None = T0 + timedelta(minutes=15),
    source: str = "Platform",
    duration: int | None = -1,
) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventStatus": status,
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": list(resources),
        "NotBefore": not_before.strftime("%a, %d %b %Y %H:%M:%S GMT") if not_before else "",
        "Description": "test",
        "EventSource": source,
        "DurationInSeconds": duration,
    }


def envelope(
    vm: str,
    sequence: int,
    events: list[dict[str, Any]] | None,
    *,
    callback_url: str | None = None,
    incarnation: int | None = None,
    scale_set: str | None = None,
    availability_set: str | None = None,
    observed_at: datetime | None = None,
    kind: str = "document",
    key: identity_harness.CallbackKey | None = None,
    polls: dict[str, float] | None = None,
) -> str:
    """A signed relay message; `polls`: the relay's clocks since its previous document
    (the impact ledger's `{"max_gap_s", "wall_jump_s"}`)."""
    document = None
    if events is not None:
        document = {"DocumentIncarnation": incarnation or sequence, "Events": events}
    at = observed_at or T0 + timedelta(seconds=sequence)
    message = {
        "schema": 1,
        "kind": kind,
        "vm": {
            "name": vm,
            "callback_url": callback_url,
            "scale_set": scale_set,
            "availability_set": availability_set,
        },
        "relay_version": "test",
        "sequence": sequence,
        "observed_at": at.isoformat(),
        "document": document,
    }
    if polls is not None:
        message["polls"] = polls
    return identity_harness.signed_envelope(
        message,
        at,
        callback_url=callback_url,
        scale_set=scale_set,
        availability_set=availability_set,
        key=key,
    )
