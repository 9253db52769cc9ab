"""Heartbeats straight into the bridge's VM table: one Table request each, no Service Bus.

Why: on Service Bus a heartbeat cost a send, a receive and a complete (three billed
operations) and a share of a Functions execution, 8,640 times per VM a month: most of the
bridge's bill at fleet size. A heartbeat only says "alive, call me back here", and Table
storage takes that as one Insert Or Merge of four plain columns (`name`, `seen`,
`callback_url`, `relay_version`) into the VM's own row of the function app's VM table,
exactly the columns the function app's own heartbeat path merges
(functions.store.tables.Store.heard): the watchdog's silence query reads them as before, and
a merge never touches what documents wrote. Nothing is read and nothing is deleted, so the
relay's identity needs only the insert and update data actions on that one table.

The row's keys are the function app's (functions/store/keys.py: `row_key`,
`vm_partition`); `vm_keys` below is the same mapping on the standard library, and a test
holds the two together. A module of its own, loaded only when --heartbeat-table is set.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import urllib.parse
from collections.abc import Callable

from relay.logs import event
from relay.models import Envelope, format_aware
from relay.sendbase import Sender, SendError
from relay.servicebus import exchange, https_opener, retry_after

TYPE_CHECKING = False
if TYPE_CHECKING:
    from relay.identity import TokenProvider

log = logging.getLogger("relay.liveness")

TABLE_API_VERSION = "2019-02-02"
MAX_KEY_CHARS = 512  # functions.store.keys.MAX_KEY_CHARS
VM_BUCKETS = 8  # functions.store.keys.VM_BUCKETS
SKEW_TOLERATED = 5.0  # seconds of clock difference with Table storage left uncorrected

_SLOW_STATUS = {
    400: "400 bad request: Table storage refused the heartbeat row (see the message)",
    401: "401 unauthorized: the token was rejected (expired or wrong SAS, or a token for "
    "another tenant)",
    403: "403 forbidden: the relay's identity may not write this table (it needs the "
    "bridge's liveness role on the VM table), or the storage firewall refused this VM",
    404: "404 not found: the storage account or table does not exist (check --heartbeat-table)",
}


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in "/\\#?%" or code < 0x20 or 0x7F <= code <= 0x9F:
        return f"%{code:02X}"
    return ch


def row_key(name: str) -> str:
    """The VM's RowKey: its name case-folded, with the characters Table keys may not hold
    escaped one-to-one, and a hash ending a name too long for a key."""
    source = name.casefold()
    escaped = "".join(_escape(ch) for ch in source)
    if not escaped:
        return "_"
    if len(escaped) <= MAX_KEY_CHARS:
        return escaped
    digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{escaped[: MAX_KEY_CHARS - 65]}~{digest}"


def vm_keys(name: str) -> tuple[str, str]:
    """(PartitionKey, RowKey) of the VM's row: a stable hash bucket of its key, and the key."""
    key = row_key(name)
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return f"vm{int.from_bytes(digest[:4], 'big') % VM_BUCKETS:02d}", key


def entity_url(table_url: str, partition_key: str, row_key_: str) -> str:
    """`TABLE(PartitionKey='..',RowKey='..')`: quotes doubled (OData), then %-encoded."""

    def literal(value: str) -> str:
        return urllib.parse.quote(value.replace("'", "''"), safe="")

    return f"{table_url}(PartitionKey='{literal(partition_key)}',RowKey='{literal(row_key_)}')"


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(epoch: float) -> str:
    """RFC 1123 in English whatever the locale (x-ms-date)."""
    t = time.gmtime(epoch)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


def parse_http_date(value: str) -> float | None:
    """Epoch seconds of an RFC 1123 `Date` header, or None if it is not one."""
    try:
        _, day, month, year, clock, zone = value.split()
        hours, minutes, seconds = (int(part) for part in clock.split(":"))
        if zone != "GMT" or len(year) != 4:
            return None
        import calendar

        moment = (int(year), _MONTHS.index(month) + 1, int(day), hours, minutes, seconds)
        return float(calendar.timegm((*moment, 0, 0, 0)))
    except (ValueError, TypeError):
        return None


class TableLiveness(Sender):
    """Writes heartbeat envelopes into the VM table (Insert Or Merge: HTTP PATCH, no
    If-Match). Authenticated by a bearer token (the VM's managed identity, resource
    https://storage.azure.com/) or a SAS query string (tests, non-Azure hosts).

    `seen` is this VM's clock, corrected by the `Date` of Table storage's last answer when
    the two differ by more than SKEW_TOLERATED: a VM whose clock drifted must not look
    silent (clock behind) or hide a silence (clock ahead)."""

    def __init__(
        self,
        table_url: str,
        *,
        tokens: TokenProvider | None = None,
        sas: str | None = None,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if (tokens is None) == (sas is None):
            raise ValueError("TableLiveness needs a token provider or a SAS, not both")
        self.table_url = table_url.rstrip("/")
        self._tokens = tokens
        self._sas = (sas or "").strip().lstrip("?")
        self._timeout = timeout
        self._clock = clock
        self._opener = https_opener()
        self.skew = 0.0  # Table storage's clock minus ours, when beyond SKEW_TOLERATED
        self.written = 0

    def describe(self) -> str:
        return self.table_url

    def send(self, envelope: Envelope, body: str) -> None:
        if envelope.kind != "heartbeat":
            raise SendError("liveness", "only heartbeats go to the VM table", slow=True)
        self.write(envelope)

    def entity(self, envelope: Envelope, now: float) -> dict[str, str]:
        partition_key, key = vm_keys(envelope.vm.name)
        from datetime import datetime, timezone

        seen = datetime.fromtimestamp(now + self.skew, timezone.utc)
        entity = {
            "PartitionKey": partition_key,
            "RowKey": key,
            "name": envelope.vm.name,
            "seen": format_aware(seen),
            "seen@odata.type": "Edm.DateTime",
            "relay_version": envelope.relay_version,
        }
        if envelope.vm.callback_url:
            entity["callback_url"] = envelope.vm.callback_url
        return entity

    def write(self, envelope: Envelope) -> None:
        """One Insert Or Merge; once more at once if that answer showed our clock is off
        (so the row never keeps a time that would make a live VM look silent)."""
        skew = self.skew
        self._write_once(envelope)
        if abs(self.skew - skew) > SKEW_TOLERATED:
            self._write_once(envelope)

    def _write_once(self, envelope: Envelope) -> None:
        import urllib.request

        now = self._clock()
        entity = self.entity(envelope, now)
        url = entity_url(self.table_url, entity["PartitionKey"], entity["RowKey"])
        headers = {
            "x-ms-version": TABLE_API_VERSION,
            "x-ms-date": http_date(now),
            "Content-Type": "application/json",
            "Accept": "application/json;odata=nometadata",
            "DataServiceVersion": "3.0;NetFx",
            "MaxDataServiceVersion": "3.0;NetFx",
        }
        if self._tokens is not None:
            headers["Authorization"] = self._tokens.authorization()
        else:
            url = f"{url}?{self._sas}"
        request = urllib.request.Request(  # noqa: S310 - https://, or a checked loopback URL
            url,
            data=json.dumps(entity, separators=(",", ":")).encode(),
            method="PATCH",
            headers=headers,
        )
        status, text, answer = exchange(self._opener, request, self._timeout, "Table storage")
        self._learn_skew(answer, now)
        if status in (200, 204):
            self.written += 1
            return
        if status in (401, 403) and self._tokens is not None:
            self._tokens.invalidate()
        if status == 429 or status >= 500:
            raise SendError(
                f"http-{status}",
                f"Table storage answered {status} (busy or unavailable); retrying",
                retry_after=retry_after(answer),
            )
        detail = _error_code(text)
        reason = _SLOW_STATUS.get(status, f"Table storage refused the heartbeat with {status}")
        raise SendError(f"http-{status}", f"{reason}: {detail}" if detail else reason, slow=True)

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
                log,
                logging.WARNING if corrected else logging.INFO,
                "clock skew with Table storage" if corrected else "clock agrees with Table storage",
                seconds=round(skew, 1),
            )
        self.skew = corrected


def _error_code(body: bytes) -> str:
    """Table storage's error code (JSON or XML answer), else the answer's first line."""
    text = body[:2000].decode("utf-8", "replace")
    try:
        error = json.loads(text).get("odata.error", {})
        return str(error.get("code") or "")[:100]
    except (ValueError, AttributeError, RecursionError):
        pass
    start = text.find("<Code>")
    if start >= 0:
        return text[start + 6 : text.find("</Code>", start)][:100]
    return text.strip().splitlines()[0][:200] if text.strip() else ""


class SplitSender(Sender):
    """Documents to their target (Service Bus, a directory); heartbeats to the VM table."""

    def __init__(self, documents: Sender, heartbeats: Sender) -> None:
        self.documents = documents
        self.heartbeats = heartbeats

    def describe(self) -> str:
        return f"{self.documents.describe()} (heartbeats: {self.heartbeats.describe()})"

    def send(self, envelope: Envelope, body: str) -> None:
        target = self.heartbeats if envelope.kind == "heartbeat" else self.documents
        target.send(envelope, body)


__all__ = ["SplitSender", "TableLiveness", "entity_url", "row_key", "vm_keys"]
