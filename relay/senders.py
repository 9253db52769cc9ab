"""Forward targets: a local directory (file:DIR) or a Service Bus queue over its REST API.

A sender either confirms one message or raises `SendError`; it never drops anything. The
send loop (`SendLoop`) keeps the message in the outbox until it is confirmed and decides
how long to wait: transient failures (5xx, 429, timeouts, refused connections) back off
exponentially with jitter; configuration failures (401, 403, 404, 410, other 4xx) cannot
heal by retrying fast, so they retry slowly while an operator fixes the cause.

The Service Bus sender speaks plain HTTPS with the standard library on purpose: the Azure
SDK (AMQP) would triple the relay's memory on every VM of the fleet, and the relay must run
on the VM's own Python with nothing installed. Heartbeats go to their own session-less
queue (contract C1) so a fleet's liveness traffic never competes with documents for
session locks.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import random
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from relay.imds import ImdsClient, ImdsError
from relay.logs import ErrorStreak, clip, event
from relay.models import DocumentError, Envelope, parse_envelope
from relay.outbox import Outbox, OutboxMessage, atomic_write

log = logging.getLogger("relay.sender")

SERVICEBUS_RESOURCE = "https://servicebus.azure.net"
IDENTITY_API_VERSION = "2018-02-01"


class SendError(Exception):
    """A message was not confirmed. `slow` means retrying soon cannot help."""

    def __init__(
        self, kind: str, message: str, *, slow: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.slow = slow
        self.retry_after = retry_after


class Sender(Protocol):
    def send(self, envelope: Envelope, body: str) -> None: ...

    def describe(self) -> str: ...


# ------------------------------------------------------------------ file:DIR


class FileSender:
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


# ------------------------------------------------------------------ tokens


class TokenProvider(Protocol):
    def authorization(self) -> str: ...

    def invalidate(self) -> None: ...


def parse_connection_string(text: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    for item in text.strip().split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError("a Service Bus connection string is KEY=VALUE pairs separated by ;")
        parts[key.strip().lower()] = value.strip()
    return parts


def sas_token(resource_uri: str, key_name: str, key: str, expiry: int) -> str:
    """Azure's documented SAS scheme: HMAC-SHA256 over `quote_plus(uri) + "\\n" + expiry`."""
    uri = urllib.parse.quote_plus(resource_uri)
    to_sign = f"{uri}\n{expiry}".encode()
    digest = hmac.new(key.encode(), to_sign, hashlib.sha256).digest()
    sig = urllib.parse.quote(base64.b64encode(digest), safe="")
    return f"SharedAccessSignature sr={uri}&sig={sig}&se={expiry}&skn={key_name}"


class SasTokenProvider:
    """SAS tokens from a connection string, renewed well before they expire."""

    def __init__(
        self,
        connection_string: str,
        resource_uri: str,
        validity: int = 3600,
        clock: Callable[[], float] = time.time,
    ) -> None:
        parts = parse_connection_string(connection_string)
        name, key = parts.get("sharedaccesskeyname"), parts.get("sharedaccesskey")
        if not name or not key:
            raise ValueError(
                "the SAS connection string needs SharedAccessKeyName and SharedAccessKey"
            )
        entity = parts.get("entitypath")
        queue = resource_uri.rsplit("/", 1)[-1]
        if entity and entity != queue:
            raise ValueError(f"the SAS connection string is for {entity!r}, not queue {queue!r}")
        self._name, self._key = name, key
        self._uri = resource_uri
        self._validity = validity
        self._clock = clock
        self._token: str | None = None
        self._expires = 0.0

    @classmethod
    def from_file(cls, path: Path, resource_uri: str) -> SasTokenProvider:
        return cls(path.read_text(encoding="utf-8"), resource_uri)

    def authorization(self) -> str:
        now = self._clock()
        if self._token is None or now > self._expires - self._validity / 4:
            self._expires = int(now) + self._validity
            self._token = sas_token(self._uri, self._name, self._key, int(self._expires))
        return self._token

    def invalidate(self) -> None:
        self._token = None


class ManagedIdentityTokenProvider:
    """Bearer tokens from the VM's managed identity (IMDS), refreshed before they expire."""

    def __init__(
        self,
        imds_url: str,
        client_id: str | None = None,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._imds = ImdsClient(imds_url, timeout)
        self._client_id = client_id
        self._timeout = timeout
        self._clock = clock
        self._token: str | None = None
        self._expires = 0.0
        self._refresh_at = 0.0

    def authorization(self) -> str:
        if self._token is None or self._clock() >= self._refresh_at:
            self._fetch()
        return f"Bearer {self._token}"

    def invalidate(self) -> None:
        self._token = None

    def _fetch(self) -> None:
        try:
            response = self._imds.get_token(SERVICEBUS_RESOURCE, self._client_id, self._timeout)
        except ImdsError as exc:
            raise SendError("token", f"managed identity token: {exc.kind}") from None
        if response.status != 200:
            slow = response.status in (400, 403, 404)
            raise SendError(
                "token",
                f"managed identity token: IMDS answered {response.status}"
                + (" (no identity assigned to this VM?)" if slow else ""),
                slow=slow,
            )
        try:
            data = json.loads(response.body)
            token = str(data["access_token"])
            now = self._clock()
            if data.get("expires_on"):
                expires = float(data["expires_on"])
            else:
                expires = now + float(data.get("expires_in", 3600))
        except (ValueError, KeyError, TypeError, RecursionError):
            raise SendError("token", "managed identity token: malformed answer") from None
        lifetime = max(expires - now, 0.0)
        self._token = token
        self._expires = expires
        # Refresh at the later of 5 minutes or 10 % of the lifetime before expiry.
        self._refresh_at = expires - max(min(300.0, lifetime / 2), lifetime / 10)


# ------------------------------------------------------------------ Service Bus

_SLOW_STATUS = {
    401: "401 unauthorized: the token was rejected (wrong SAS key or key name, expired "
    "token, or the identity lacks the 'Azure Service Bus Data Sender' role)",
    403: "403 forbidden: quota exceeded, message too large, or no send right on the queue",
    404: "404 not found: the namespace or queue does not exist",
    410: "410 gone: the queue does not exist (deleted or disabled)",
}


class ServiceBusSender:
    """POST one message per envelope to `https://NAMESPACE/QUEUE/messages`.

    Documents go to the session queue (SessionId = VM name keeps one VM's documents in
    order); heartbeats go to `heartbeat_queue` without a SessionId (contract C1), or with
    the documents when it is None or "".
    """

    def __init__(
        self,
        namespace: str,
        queue: str,
        tokens: TokenProvider,
        ttl_seconds: int,
        timeout: float = 30.0,
        endpoint: str | None = None,
        heartbeat_queue: str | None = None,
        heartbeat_tokens: TokenProvider | None = None,
    ) -> None:
        base = endpoint or f"https://{namespace}"
        self.url = f"{base}/{queue}/messages"
        self.heartbeat_url = f"{base}/{heartbeat_queue}/messages" if heartbeat_queue else None
        self._tokens = tokens
        self._heartbeat_tokens = heartbeat_tokens or tokens
        self._ttl = ttl_seconds
        self._timeout = timeout
        self._opener: Any = None

    def describe(self) -> str:
        return self.url

    def _open(self, request: Any) -> tuple[int, bytes, dict[str, str]]:
        import urllib.error
        import urllib.request

        if self._opener is None:
            # Honours HTTPS_PROXY / NO_PROXY, as an operator behind a proxy expects.
            self._opener = urllib.request.build_opener()
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                return response.status, response.read(4096), dict(response.headers.items())
        except urllib.error.HTTPError as exc:
            body = b""
            with contextlib.suppress(OSError):
                body = exc.read(4096)
            return exc.code, body, dict(exc.headers.items())

    def send(self, envelope: Envelope, body: str) -> None:
        import urllib.error
        import urllib.request

        heartbeat_apart = envelope.kind == "heartbeat" and self.heartbeat_url is not None
        props: dict[str, Any] = {"MessageId": envelope.message_id()}
        if not heartbeat_apart:
            props["SessionId"] = envelope.vm.name
        props.update(TimeToLive=self._ttl, Label=envelope.kind)
        tokens = self._heartbeat_tokens if heartbeat_apart else self._tokens
        url = self.heartbeat_url if heartbeat_apart else self.url
        request = urllib.request.Request(  # noqa: S310 - https://, or a checked loopback stand-in
            url,  # type: ignore[arg-type]
            data=body.encode(),
            method="POST",
            headers={
                "Authorization": tokens.authorization(),
                "Content-Type": "application/json",
                "BrokerProperties": json.dumps(props, separators=(",", ":")),
            },
        )
        try:
            status, text, headers = self._open(request)
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise SendError(
                    "timeout", f"Service Bus did not answer in {self._timeout}s"
                ) from None
            raise SendError("connection", f"cannot reach Service Bus: {clip(exc)}") from None
        except (socket.timeout, TimeoutError):
            raise SendError("timeout", f"Service Bus did not answer in {self._timeout}s") from None
        except (OSError, ValueError, http_client_errors()) as exc:
            raise SendError("request", f"Service Bus request failed: {clip(exc)}") from None
        if status == 201:
            return
        if status == 401:
            tokens.invalidate()
        if status in _SLOW_STATUS:
            raise SendError(f"http-{status}", _SLOW_STATUS[status], slow=True)
        if status == 429 or status >= 500:
            raise SendError(
                f"http-{status}",
                f"Service Bus answered {status} (busy or unavailable); retrying",
                retry_after=_retry_after(headers),
            )
        raise SendError(
            f"http-{status}",
            f"Service Bus refused the message with {status}: "
            f"{text[:200].decode('utf-8', 'replace')}",
            slow=True,
        )


def http_client_errors() -> type[Exception]:
    import http.client

    return http.client.HTTPException


def _retry_after(headers: dict[str, str]) -> float | None:
    value = {k.lower(): v for k, v in headers.items()}.get("retry-after")
    try:
        return float(value) if value else None
    except ValueError:
        return None


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
        return base * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not security


def build_sender(settings: object) -> Sender:
    """The sender the settings ask for; raises ValueError for a setting that cannot work."""
    from relay.settings import RelaySettings

    assert isinstance(settings, RelaySettings)
    target = settings.forward_target
    heartbeat_queue = settings.heartbeat_queue or None
    if target.kind == "file":
        assert target.directory is not None
        return FileSender(target.directory, None if heartbeat_queue else target.directory)
    assert target.namespace and target.queue
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


__all__ = [
    "FileSender",
    "ManagedIdentityTokenProvider",
    "SasTokenProvider",
    "SendError",
    "SendLoop",
    "ServiceBusSender",
    "build_sender",
]
