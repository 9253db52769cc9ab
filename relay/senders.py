"""Forward targets: a local directory (file:DIR) or a Service Bus queue over its REST API.

A sender either confirms one message or raises `SendError`; it never drops anything. The
send loop (`SendLoop`) keeps the message in the outbox until it is confirmed and decides
how long to wait: transient failures (5xx, 429, timeouts, refused connections) back off
exponentially with jitter; configuration failures (401, 403, 404, 410, other 4xx) cannot
heal by retrying fast, so they retry slowly while an operator fixes the cause.

Service Bus lives in relay.servicebus, imported only when the forward target is a queue.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path

from relay.logs import ErrorStreak, event, jitter
from relay.models import DocumentError, Envelope, parse_envelope
from relay.outbox import Outbox, OutboxMessage, atomic_write
from relay.sendbase import Sender, SendError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("relay.sender")


# ------------------------------------------------------------------ file:DIR


class FileSender(Sender):
    """Each message becomes its own JSON file, written atomically; names sort in send order.

    The name is `<sequence:012d>-<vm>-<kind>.json`: the relay's sequence only grows, so one
    VM's files sort in the order they were sent, and a resend after a crash rewrites the same
    file instead of adding a duplicate.
    """

    def __init__(self, directory: Path, heartbeat_directory: Path | None = None) -> None:
        self.directory = directory
        # Contract C1: heartbeats in DIR/heartbeats/, as if on their own queue.
        self.heartbeat_directory = (
            directory / "heartbeats" if heartbeat_directory is None else heartbeat_directory
        )

    def describe(self) -> str:
        return f"file:{self.directory}"

    def send(self, envelope: Envelope, body: str) -> None:
        vm = re.sub(r"[^A-Za-z0-9._-]", "_", envelope.vm.name)
        directory = self.heartbeat_directory if envelope.kind == "heartbeat" else self.directory
        path = directory / f"{envelope.sequence:012d}-{vm}-{envelope.kind}.json"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            atomic_write(path, body.encode())
        except OSError as exc:
            raise SendError(
                "file", f"cannot write {path}: {exc.strerror or exc}", slow=True
            ) from None


# ------------------------------------------------------------------ send loop


class SendLoop:
    """Drain the outbox in order through one sender, forever, without losing a message."""

    def __init__(
        self,
        outbox: Outbox,
        sender: Sender,
        max_backoff: float = 60.0,
        slow_retry: float = 300.0,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        self.outbox = outbox
        self.sender = sender
        self._max_backoff = max_backoff
        self._slow = slow_retry
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self.streak = ErrorStreak(log, f"forwarding to {sender.describe()}")
        self.sent = 0
        self._thread: threading.Thread | None = None

    def start(self) -> SendLoop:
        self._thread = threading.Thread(target=self.run, name="relay-sender", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.outbox.wake()
        if self._thread:
            self._thread.join(timeout)

    @property
    def healthy(self) -> bool:
        return not self.streak.failing

    def run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            message = self.outbox.oldest(timeout=5.0)  # append() and stop() wake it
            if message is None:
                continue
            try:
                self.send_one(message)
            except SendError as exc:
                failures += 1
                level = logging.ERROR if exc.slow else logging.WARNING
                self.streak.error(exc.kind, str(exc), level=level, pending=len(self.outbox))
                if message.kind == "heartbeat":
                    # A heartbeat goes to its own queue, which may fail on its own (missing,
                    # no send right); it must never hold documents up. With anything behind
                    # it, it is dropped (the next one says the same); alone, it waits for
                    # its retry only until something else is queued.
                    if len(self.outbox) > 1:
                        self.outbox.remove(message)
                        continue
                    self.outbox.wait_while_size(1, self._delay(exc, failures), self._stop)
                    continue
                self._sleep(self._delay(exc, failures))
                continue
            failures = 0
            self.streak.ok()

    def send_one(self, message: OutboxMessage) -> None:
        try:
            body = message.read()
            envelope = parse_envelope(body)
        except FileNotFoundError:
            # Replaced by a newer heartbeat while we looked at it; nothing to send.
            self.outbox.remove(message)
            return
        except (OSError, UnicodeDecodeError, DocumentError) as exc:
            self.outbox.reject(message, str(exc))
            return
        self.sender.send(envelope, body)
        self.outbox.remove(message)
        self.sent += 1
        event(
            log,
            logging.INFO,
            "forwarded",
            kind=envelope.kind,
            sequence=envelope.sequence,
            message_id=envelope.message_id(),
        )

    def _delay(self, exc: SendError, failures: int) -> float:
        if exc.slow:
            base = self._slow
        else:
            base = min(self._max_backoff, 0.5 * 2 ** min(failures - 1, 16))
            if exc.retry_after:
                base = max(base, min(exc.retry_after, self._max_backoff * 2))
        return base * jitter(0.8, 1.2)


def build_sender(settings: object, keys: Any = None, attester: Any = None) -> Sender:
    """The sender the settings ask for; raises ValueError for a setting that cannot work.

    With `keys` (relay.keystore.KeyStore) and `attester` (relay.attest.Attester), what goes
    to Service Bus or a directory is attested at send time (contract §1), and heartbeats
    into the liveness table are signed with the callback key (contract §5)."""
    from relay.settings import RelaySettings

    assert isinstance(settings, RelaySettings)
    if not settings.heartbeat_table:
        return _attested(
            _document_sender(settings, settings.heartbeat_queue or None), keys, attester
        )
    from relay.liveness import SplitSender, TableLiveness

    documents = _attested(_document_sender(settings, None), keys, attester)
    if settings.heartbeat_table_sas_file is not None:
        sas = settings.heartbeat_table_sas_file.read_text(encoding="utf-8")
        heartbeats = TableLiveness(
            settings.heartbeat_table, sas=sas, timeout=settings.send_timeout, keys=keys
        )
    else:
        from relay.identity import STORAGE_RESOURCE, ManagedIdentityTokenProvider

        tokens = ManagedIdentityTokenProvider(
            settings.imds_url, settings.identity_client_id, resource=STORAGE_RESOURCE
        )
        heartbeats = TableLiveness(
            settings.heartbeat_table, tokens=tokens, timeout=settings.send_timeout, keys=keys
        )
    return SplitSender(documents, heartbeats, state=settings.state_dir)


def _attested(sender: Sender, keys: Any, attester: Any) -> Sender:
    if keys is None or attester is None:
        return sender
    from relay.attest import AttestingSender

    return AttestingSender(sender, attester, keys)


def _document_sender(settings: Any, heartbeat_queue: str | None) -> Sender:
    target = settings.forward_target
    if target.kind == "file":
        assert target.directory is not None
        return FileSender(target.directory, None if heartbeat_queue else target.directory)
    assert target.namespace and target.queue
    from relay.servicebus import (
        ManagedIdentityTokenProvider,
        SasTokenProvider,
        ServiceBusSender,
        TokenProvider,
        parse_connection_string,
    )

    tokens: TokenProvider
    heartbeat_tokens: TokenProvider | None = None
    if settings.sas_connection_string_file is not None:
        text = settings.sas_connection_string_file.read_text(encoding="utf-8")
        tokens = SasTokenProvider(text, target.resource_uri)
        if heartbeat_queue and heartbeat_queue != target.queue:
            entity = parse_connection_string(text).get("entitypath")
            if entity:
                raise ValueError(
                    f"the SAS connection string is for queue {entity!r} only, and heartbeats "
                    f"go to queue {heartbeat_queue!r}: use a namespace-level rule (no "
                    "EntityPath), or --heartbeat-queue '' to send heartbeats with the documents"
                )
            heartbeat_tokens = SasTokenProvider(
                text, f"https://{target.namespace}/{heartbeat_queue}"
            )
    else:
        tokens = ManagedIdentityTokenProvider(settings.imds_url, settings.identity_client_id)
    return ServiceBusSender(
        target.namespace,
        target.queue,
        tokens,
        ttl_seconds=settings.message_ttl,
        timeout=settings.send_timeout,
        endpoint=settings.servicebus_endpoint,
        heartbeat_queue=heartbeat_queue,
        heartbeat_tokens=heartbeat_tokens,
    )


__all__ = ["FileSender", "SendError", "SendLoop", "Sender", "build_sender"]
