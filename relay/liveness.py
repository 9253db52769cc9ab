"""Heartbeats into the liveness table: one Table request each, no Service Bus (contract §5).

Why: on Service Bus a heartbeat cost a send, a receive and a complete (three billed
operations) and a share of a Functions execution, 8,640 times per VM a month: most of the
bridge's bill at fleet size. A heartbeat only says "alive", and Table storage takes that as
one Insert Or Merge into this VM's row of `{prefix}liveness`, a table of untrusted hints of
its own: no relay credential can write a table the app reads as truth (issue 22).

Row (contract §5, v2): RowKey = hex HMAC-SHA256(secret, "liveness-row/v1"), so only this
VM's relay and the app (which holds the key) can find or write it: every relay may write
anywhere in the table (Table RBAC cannot scope rows), and a row keyed by vmId could be
overwritten by any VM that knows the vmId, hiding a dead relay's silence (issue 27).
PartitionKey `lvNN` (NN = int(RowKey[:8], 16) % 8); columns `vm_id`, `seen` (Edm.DateTime,
the second of `at`), `at` (Edm.Int64 unix seconds), `relay_version` (<= 64 characters),
`key_id` (the KID of the key), and since relay contract 2 (issue 44) `contract` (Edm.Int32,
2), `probe_at` (Edm.Int64: when Azure's load-balancer probe last reached the readiness
responder, 0 = never) and `drain` (the drain means this relay offers, e.g. "hook,readiness");
`sig` = hex HMAC-SHA256(secret, "liveness/v2\n{vm_id}\n{at}\n{relay_version}\n{contract}\n
{probe_at}\n{drain}") (v1 rows, of relays before 0.2.0, signed "liveness/v1\n{vm_id}\n{at}\n
{relay_version}" and without the three columns, are still accepted by the app). The app
counts a row only if the vmId is
enrolled and the KID, the RowKey and the signature match that VM's key. For 24 h after a
key rotation the previous key's row is written too (under that key), so an app that has not
learnt the new key yet never sees this relay fall silent; the app deletes it once stale.
Nothing is read and nothing is deleted here, so the relay's identity needs only the insert
and update data actions on this one table. A module of its own, loaded only when
--heartbeat-table is set.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from collections.abc import Callable
from datetime import datetime, timezone

from relay import CONTRACT
from relay.logs import event
from relay.models import Envelope, format_aware, http_date
from relay.outbox import atomic_write
from relay.sendbase import Sender, SendError
from relay.servicebus import SKEW_TOLERATED, AzureClock, exchange, https_opener, retry_after
from relay.signing import hmac_sha256, key_id, sha256

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from relay.identity import TokenProvider
    from relay.keystore import KeyStore

log = logging.getLogger("relay.liveness")

TABLE_API_VERSION = "2019-02-02"
LIVENESS_BUCKETS = 8
MAX_RELAY_VERSION = 64
MAX_DRAIN = 64

_SLOW_STATUS = {
    400: "400 bad request: Table storage refused the heartbeat row (see the message)",
    401: "401 unauthorized: the token was rejected (expired or wrong SAS, or a token for "
    "another tenant)",
    403: "403 forbidden: the relay's identity may not write this table (it needs the "
    "bridge's liveness role on the liveness table), or the storage firewall refused this VM",
    404: "404 not found: the storage account or table does not exist (check --heartbeat-table)",
}


ROW_KEY_LABEL = b"liveness-row/v1"
PENDING_LABEL = b"doc-pending/v1\n"
ACKS_FILE = "pending-acks.json"  # in the state directory: the rows named, across restarts


def liveness_keys(vm_id: str) -> tuple[str, str]:
    """(PartitionKey, RowKey) of a liveness row keyed by vmId: the layout of relays before
    issue 27, which the app still reads (and preflight checks report)."""
    vm_id = vm_id.lower()
    bucket = int(sha256(vm_id.encode()).hexdigest()[:8], 16) % LIVENESS_BUCKETS
    return f"lv{bucket:02d}", vm_id


def liveness_row_keys(secret: bytes) -> tuple[str, str]:
    """(PartitionKey, RowKey) of the liveness row under this callback key (contract §5 v2):
    neither can be computed without the key."""
    row = hmac_sha256(secret, ROW_KEY_LABEL).hex()
    return f"lv{int(row[:8], 16) % LIVENESS_BUCKETS:02d}", row


def pending_row_keys(secret: bytes, sequence: int) -> tuple[str, str]:
    """(PartitionKey, RowKey) of the row saying document `sequence` awaits the app
    (contract §11): `akNN`, HMAC-SHA256(key, "doc-pending/v1\\n{sequence}")."""
    row = hmac_sha256(secret, PENDING_LABEL + str(sequence).encode()).hex()
    return f"ak{int(row[:8], 16) % LIVENESS_BUCKETS:02d}", row


def liveness_signature(
    secret: bytes, vm_id: str, at: int, relay_version: str, probe_at: int = 0, drain: str = ""
) -> str:
    """The `sig` of a contract-2 row (liveness/v2): every column the app believes."""
    message = f"liveness/v2\n{vm_id}\n{at}\n{relay_version}\n{CONTRACT}\n{probe_at}\n{drain}"
    return hmac_sha256(secret, message.encode()).hex()


def entity_url(table_url: str, partition_key: str, row_key_: str) -> str:
    """`TABLE(PartitionKey='..',RowKey='..')`: quotes doubled (OData), then %-encoded."""

    def literal(value: str) -> str:
        return urllib.parse.quote(value.replace("'", "''"), safe="")

    return f"{table_url}(PartitionKey='{literal(partition_key)}',RowKey='{literal(row_key_)}')"


class TableLiveness(AzureClock, Sender):
    """Writes heartbeat envelopes into the liveness table (Insert Or Merge: HTTP PATCH, no
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
        keys: KeyStore | None = None,
        facts: Callable[[], tuple[int, str]] = lambda: (0, ""),
    ) -> None:
        if (tokens is None) == (sas is None):
            raise ValueError("TableLiveness needs a token provider or a SAS, not both")
        self.table_url = table_url.rstrip("/")
        self._tokens = tokens
        self._sas = (sas or "").strip().lstrip("?")
        self._timeout = timeout
        self._clock = clock
        self.keys = keys
        self.facts = facts  # (probe_at, drain means) at each heartbeat: relay.responder
        self._opener = https_opener()
        self.written = 0

    def describe(self) -> str:
        return self.table_url

    def send(self, envelope: Envelope, body: str) -> None:
        if envelope.kind != "heartbeat":
            raise SendError("liveness", "only heartbeats go to the liveness table", slow=True)
        if not envelope.vm.vm_id or self.keys is None:
            raise SendError("liveness", "no vmId or callback key to sign the row", slow=True)
        self.write(envelope)

    def entity(self, envelope: Envelope, now: float, secret: bytes | None = None) -> dict[str, Any]:
        """The row under `secret` (the current key by default)."""
        assert envelope.vm.vm_id and self.keys is not None
        vm_id = envelope.vm.vm_id.lower()
        if secret is None:
            secret = self.keys.current_key().secret
        partition_key, row = liveness_row_keys(secret)
        at = int(now + self.skew)
        version = envelope.relay_version[:MAX_RELAY_VERSION]
        probe_at, drain = self.facts()
        probe_at, drain = max(0, int(probe_at)), drain[:MAX_DRAIN]
        return {
            "PartitionKey": partition_key,
            "RowKey": row,
            "vm_id": vm_id,
            "seen": format_aware(datetime.fromtimestamp(at, timezone.utc)),
            "seen@odata.type": "Edm.DateTime",
            "at": str(at),
            "at@odata.type": "Edm.Int64",
            "relay_version": version,
            "key_id": key_id(secret),
            "contract": CONTRACT,
            "probe_at": str(probe_at),
            "probe_at@odata.type": "Edm.Int64",
            "drain": drain,
            "sig": liveness_signature(secret, vm_id, at, version, probe_at, drain),
        }

    def write(self, envelope: Envelope) -> None:
        """One Insert Or Merge per key (the previous key's row too, within 24 h of a
        rotation); once more at once if that answer showed our clock is off (so the row
        never keeps a time that would make a live VM look silent)."""
        assert self.keys is not None
        for secret in self.keys.keys().values():  # the current key first
            skew = self.skew
            self._write_once(envelope, secret)
            if abs(self.skew - skew) > SKEW_TOLERATED:
                self._write_once(envelope, secret)

    def _write_once(self, envelope: Envelope, secret: bytes) -> None:
        now = self._clock()
        entity = self.entity(envelope, now, secret)
        self._patch(entity["PartitionKey"], entity["RowKey"], entity, now)
        self.written += 1

    def pending(self, sequence: int, probe: bool = False) -> bool:
        """Say that document `sequence` awaits the app (Insert Or Merge of its pending row),
        or with `probe` ask whether it still does: a Merge Entity with If-Match: * of a row
        the app deleted, once it had the document, is a 404 (contract §11)."""
        assert self.keys is not None
        now = self._clock()
        keys = pending_row_keys(self.keys.current_key().secret, sequence)
        entity = {} if probe else {"at": str(int(now)), "at@odata.type": "Edm.Int64"}
        return self._patch(*keys, entity, now, probe) != 404

    def _patch(
        self, partition_key: str, row: str, entity: dict[str, Any], now: float, probe: bool = False
    ) -> int:
        import urllib.request

        url = entity_url(self.table_url, partition_key, row)
        headers = {
            "x-ms-version": TABLE_API_VERSION,
            "x-ms-date": http_date(now),
            "Content-Type": "application/json",
            "Accept": "application/json;odata=nometadata",
            "DataServiceVersion": "3.0;NetFx",
            "MaxDataServiceVersion": "3.0;NetFx",
        }
        if probe:
            headers["If-Match"] = "*"  # Merge Entity: the row must exist
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
        if status in (200, 204) or (probe and status == 404):
            return status
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
    """Documents to their target (Service Bus, a directory); heartbeats to the liveness table.

    And no document is lost for good (issue 40, contract §11). Before a document goes, a
    pending row says it awaits the app, and the app deletes that row once the document
    reached the lifecycle; the document names the rows (`acks`: its own sequence and those
    of earlier documents not yet seen deleted). Service Bus answers a send with no word of
    what became of the message, so at each heartbeat the latest document's row is probed,
    and while it is there the document goes again 2, 4 and 8 heartbeats later, then every
    12 (never at the first: that one may come before the app got round to it): a
    dead-lettered or dropped document delays what it says, never loses it.
    A resend is the same envelope (sequence, observed_at) with `resent` counting, so its
    MessageId differs and Service Bus's duplicate detection keeps it.

    With `state` (the state directory) the rows named (`acks`, and their key's id) are kept
    in STATE/ACKS_FILE, written before each row, so a restarted relay names the rows of
    documents the app never had in its next document, and the app deletes them then
    (issue 46): in memory only, such a row stayed forever. The sequences cannot be found
    otherwise: heartbeats take sequences too, so the app cannot tell a document's row from
    a heartbeat's number. Rows under a key rotated out meanwhile are not named (the app
    deletes under the key a document carries)."""

    def __init__(self, documents: Sender, heartbeats: Sender, state: Path | None = None) -> None:
        self.documents = documents
        self.heartbeats = heartbeats
        self.acks: list[int] = []
        self.last: Envelope | None = None  # the latest document, until the app has it
        self.key = ""  # the key id the pending rows are under
        self.marked = False
        self.ticks = self.wait = 0
        self.file = state / ACKS_FILE if state is not None else None
        self.saved: tuple[str, list[int]] | None = None  # None: not read yet

    def describe(self) -> str:
        return f"{self.documents.describe()} (heartbeats: {self.heartbeats.describe()})"

    def send(self, envelope: Envelope, body: str) -> None:
        table = self.heartbeats
        if envelope.kind == "heartbeat":
            table.send(envelope, body)
            self._check()
            return
        if envelope.kind != "document" or not isinstance(table, TableLiveness) or not table.keys:
            self.documents.send(envelope, body)
            return
        self._restore()
        key = table.keys.current_key().id
        if key != self.key:  # the rows were under the old key; the app reads the new one
            self.key, self.acks = key, []
        sequence = envelope.sequence
        self.acks = [*[s for s in self.acks if s != sequence][-7:], sequence]
        envelope = envelope.replace(extra={**envelope.extra, "acks": self.acks})
        self._save()  # before the row: no row is written that a restart would not name
        # First, so that the app, however fast, deletes a row that exists.
        self.marked = self._try(table.pending, sequence)
        self.documents.send(envelope, envelope.to_json())
        self.last, self.ticks, self.wait = envelope, 0, 2

    def _check(self) -> None:
        last, table = self.last, self.heartbeats
        if last is None or not isinstance(table, TableLiveness):
            return
        if not self.marked:
            self.marked = self._try(table.pending, last.sequence)
            return
        there = self._try(table.pending, last.sequence, True)
        if there is None:
            return
        if not there:
            self.last, self.acks = None, []
            self._save()
            return
        self.ticks += 1
        if self.ticks < self.wait:
            return
        resent = int(last.extra.get("resent") or 0) + 1
        again = last.replace(extra={**last.extra, "resent": resent})
        event(
            log,
            logging.WARNING,
            "the app has not acknowledged the latest document; sending it again",
            sequence=last.sequence,
            resent=resent,
        )
        if self._try(self.documents.send, again, again.to_json()) is not None:
            self.last, self.ticks, self.wait = again, 0, min(self.wait * 2, 12)

    def _restore(self) -> None:
        """Read the rows named before a restart, once (a damaged file: none, logged)."""
        if self.saved is not None or self.file is None:
            return
        self.saved = ("", [])
        try:
            data = json.loads(self.file.read_text(encoding="utf-8"))
            key, acks = data["key"], data["acks"]
            if not isinstance(key, str) or not isinstance(acks, list) or len(acks) > 8:
                raise ValueError("not a key id and at most 8 sequences")
            if not all(type(s) is int and s >= 0 for s in acks):
                raise ValueError("a sequence is not a whole number >= 0")
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            event(log, logging.WARNING, "pending rows file unreadable; naming none", error=str(exc))
            return
        self.key, self.acks = key, acks
        self.saved = (key, list(acks))

    def _save(self) -> None:
        """Keep the rows named (and their key) for a restart; a failed write is logged and
        costs only the sweep of those rows."""
        if self.file is None or self.saved == (self.key, self.acks):
            return
        text = json.dumps({"key": self.key, "acks": self.acks}, separators=(",", ":"))
        try:
            atomic_write(self.file, text.encode(), 0o600)
        except OSError as exc:
            event(log, logging.WARNING, "cannot keep the pending rows named", error=str(exc))
            return
        self.saved = (self.key, list(self.acks))

    def _try(self, call: Callable[..., Any], *args: Any) -> Any:
        """`call`'s answer (True for none), or None when it failed (logged): the next
        heartbeat tries again."""
        try:
            answer = call(*args)
            return True if answer is None else answer
        except SendError as exc:
            event(log, logging.WARNING, "acknowledgement row or resend failed", error=str(exc))
            return None


__all__ = [
    "SplitSender",
    "TableLiveness",
    "entity_url",
    "liveness_keys",
    "liveness_row_keys",
    "liveness_signature",
    "pending_row_keys",
]
