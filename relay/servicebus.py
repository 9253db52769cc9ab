"""Forwarding to Service Bus: its REST "Send Message" call and SAS tokens.

Plain HTTPS with the standard library on purpose: the Azure SDK (AMQP) would triple the
relay's memory on every VM of the fleet, and the relay must run on the VM's own Python with
nothing installed. Documents go to the session queue (SessionId = vmId keeps one VM's
documents in order); heartbeats go to their own session-less queue (contract C1) so a
fleet's liveness traffic never competes with documents for session locks. A module of its
own, loaded only when forwarding to Service Bus: a relay writing to a directory never
loads urllib, http.client or ssl.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
import urllib.parse
from collections.abc import Callable

from relay.identity import (
    SERVICEBUS_RESOURCE,
    ManagedIdentityTokenProvider,
    TokenProvider,
)
from relay.logs import clip, event
from relay.models import parse_http_date
from relay.sendbase import Sender, SendError
from relay.signing import hmac_sha256

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from relay.models import Envelope


# ------------------------------------------------------------------ tokens
# (managed identity: relay.identity, shared with the Table heartbeats)


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
    digest = hmac_sha256(key.encode(), to_sign)
    import base64  # Service Bus with SAS only

    sig = urllib.parse.quote(base64.b64encode(digest), safe="")
    return f"SharedAccessSignature sr={uri}&sig={sig}&se={expiry}&skn={key_name}"


class SasTokenProvider(TokenProvider):
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

    def authorization(self) -> str:
        now = self._clock()
        if self._token is None or now > self._expires - self._validity / 4:
            self._expires = int(now) + self._validity
            self._token = sas_token(self._uri, self._name, self._key, int(self._expires))
        return self._token

    def invalidate(self) -> None:
        self._token = None


# ------------------------------------------------------------------ Azure's clock

SKEW_TOLERATED = 5.0  # seconds of clock difference with Azure left uncorrected


class AzureClock:
    """Azure's clock as the `Date` of its answers to this relay's own requests shows it
    (Table storage's to the heartbeats, Service Bus's to every send): one estimator for
    both senders, so a relay whose heartbeats go over Service Bus measures the skew too.
    `skew` is Azure's clock minus ours when beyond SKEW_TOLERATED, else 0."""

    skew = 0.0
    _clock: Callable[[], float] = time.time

    def azure_time(self) -> float:
        """This VM's clock corrected by the skew measured against Azure (its own clock
        until one is measured): the callback judges signatures' timestamps by it
        (relay.__main__.callback_clock, issue 46), so a guest clock minutes off does not
        refuse every approval while the relay is heard.

        Trust: the skew comes only from the `Date` header of Azure's answers to this
        relay's own requests, over HTTPS to the account or namespace in the settings
        (plain http only to a loopback stand-in): Azure's clock, which the app's (Azure
        Functions') follows too. Neither the app nor any VM can move it, and no callback
        does; a callback replayed after its window is refused as before, only the window
        is on Azure's time."""
        return self._clock() + self.skew

    def _learn_skew(self, headers: dict[str, str], sent_at: float) -> None:
        value = {k.lower(): v for k, v in headers.items()}.get("date")
        server = parse_http_date(value) if value else None
        if server is None:
            return
        # The Date is whole seconds, stamped between sending and now: compare it with the
        # middle of that span.
        skew = server - (sent_at + self._clock()) / 2
        corrected = skew if abs(skew) > SKEW_TOLERATED else 0.0
        if (corrected == 0.0) != (self.skew == 0.0):
            event(
                logging.getLogger("relay.clock"),
                logging.WARNING if corrected else logging.INFO,
                "clock skew with Azure" if corrected else "clock agrees with Azure",
                seconds=round(skew, 1),
            )
        self.skew = corrected


# ------------------------------------------------------------------ Service Bus

_SLOW_STATUS = {
    401: "401 unauthorized: the token was rejected (wrong SAS key or key name, expired "
    "token, or the identity lacks the 'Azure Service Bus Data Sender' role)",
    403: "403 forbidden: quota exceeded, message too large, or no send right on the queue",
    404: "404 not found: the namespace or queue does not exist",
    410: "410 gone: the queue does not exist (deleted or disabled)",
}


class ServiceBusSender(AzureClock, Sender):
    """POST one message per envelope to `https://NAMESPACE/QUEUE/messages`.

    Documents go to the session queue (SessionId = vmId keeps one VM's documents in
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
        self._opener = https_opener()

    def describe(self) -> str:
        return self.url

    def send(self, envelope: Envelope, body: str) -> None:
        import urllib.request

        heartbeat_apart = envelope.kind == "heartbeat" and self.heartbeat_url is not None
        props: dict[str, Any] = {"MessageId": envelope.message_id()}
        if not heartbeat_apart:
            props["SessionId"] = envelope.session_id
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
        now = self._clock()
        status, text, headers = exchange(self._opener, request, self._timeout, "Service Bus")
        self._learn_skew(headers, now)
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
                retry_after=retry_after(headers),
            )
        raise SendError(
            f"http-{status}",
            f"Service Bus refused the message with {status}: "
            f"{text[:200].decode('utf-8', 'replace')}",
            slow=True,
        )


def https_opener() -> Any:
    """A urllib opener (honours HTTPS_PROXY / NO_PROXY, as an operator behind a proxy
    expects); built on first use so a relay forwarding to a directory never loads it."""
    import urllib.request

    return urllib.request.build_opener()


def exchange(
    opener: Any, request: Any, timeout: float, service: str
) -> tuple[int, bytes, dict[str, str]]:
    """One HTTPS request: its status, the first 4 KiB of its body and its headers. An
    HTTP error status is an answer, not an exception; anything that got no answer raises
    SendError (timeout, connection, request) naming `service`, for the send loop to retry."""
    import urllib.error

    try:
        try:
            with opener.open(request, timeout=timeout) as response:
                return response.status, response.read(4096), dict(response.headers.items())
        except urllib.error.HTTPError as exc:
            body = b""
            with contextlib.suppress(OSError):
                body = exc.read(4096)
            return exc.code, body, dict(exc.headers.items())
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (socket.timeout, TimeoutError)):
            raise SendError("timeout", f"{service} did not answer in {timeout}s") from None
        raise SendError("connection", f"cannot reach {service}: {clip(exc)}") from None
    except (socket.timeout, TimeoutError):
        raise SendError("timeout", f"{service} did not answer in {timeout}s") from None
    except (OSError, ValueError, http_client_errors()) as exc:
        raise SendError("request", f"{service} request failed: {clip(exc)}") from None


def http_client_errors() -> type[Exception]:
    import http.client

    return http.client.HTTPException


def retry_after(headers: dict[str, str]) -> float | None:
    value = {k.lower(): v for k, v in headers.items()}.get("retry-after")
    try:
        return float(value) if value else None
    except ValueError:
        return None


__all__ = [
    "SERVICEBUS_RESOURCE",
    "ManagedIdentityTokenProvider",
    "SasTokenProvider",
    "ServiceBusSender",
    "TokenProvider",
    "parse_connection_string",
    "sas_token",
]
