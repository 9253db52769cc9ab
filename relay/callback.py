"""The signed callback: `POST /v1/start` (approve), `POST /v1/hook` (drain), `GET /v1/health`.

Approving an event lets it proceed for every VM in its `Resources`, so this is the one
place the relay can do harm. It therefore trusts nothing it is sent: the signature must be
valid, fresh and unseen, and each EventId must be, in an IMDS read made for this request,
present, still `Scheduled` and naming this VM. Any doubt refuses the whole request and
approves nothing.

A shared event (one EventId in several VMs' documents) is decided by the app on the view
one VM reported; a VM that forged its view (another type or source, a shorter duration, a
moved NotBefore, itself added to `Resources`) must not get it approved elsewhere. So
/v1/start carries the view the decision rests on (`Expect`, relay.expect): each EventId of
the request with an entry there is compared with this VM's own fresh IMDS view, and any
difference refuses the whole request with a 409 `{"error": "event ID differs from this
VM's view: ...", "results": {ID: "differs"}}` naming the field, before IMDS is asked to
start anything. An app that sends only EventType and EventSource is still served.

Signatures are scheme v2 only (issue 22, relay.signing.verify_v2): made with this relay's
own key (relay.keystore; the current one, or the previous one for 24 h after a rotation),
naming this VM's vmId as the target. A request signed for another VM is a 403, an unknown
key id or a v1 signature a 401. The health answer counts which key matched, never showing
a key.

A /v1/start may carry an `AttemptId` (issue 31): a repeat of an attempt IMDS accepted is
answered from relay.startlog, `"repeated": true`, without a second StartRequests.

Answers (JSON): 200 `{"imds_status": 200, "results": {EventId: "approved"}}`; 502 with the
same shape when IMDS refused the StartRequests; 4xx/5xx `{"error": reason}` (for /v1/start
refusals also `"results": {EventId: verdict}`) and nothing approved. A byte-identical request
(same second, same body) is a replay: callers repeating within a second add any extra field,
e.g. a "Nonce". The HTTP server itself (bounded, fair between addresses) is
relay.callback_http.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from relay.callback_http import (
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_READ_TIMEOUT,
    MAX_BODY,
    CallbackHTTPServer,
    CallbackServer,
    Refused,
)
from relay.expect import BadExpect, differences, parse_expect
from relay.imds import ImdsClient, ImdsError
from relay.logs import event
from relay.signing import (
    KEY_ID_HEADER,
    MAX_SKEW_SECONDS,
    MalformedSignature,
    SignatureError,
    WrongTarget,
    verify_v2,
)
from relay.startlog import valid_attempt_id

TYPE_CHECKING = False
if TYPE_CHECKING:  # hooks (and subprocess) are loaded only when hooks are configured
    from typing import Any

    from relay.hooks import HookRunner
    from relay.keystore import KeyStore
    from relay.startlog import StartLog

__all__ = [
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_READ_TIMEOUT",
    "MAX_BODY",
    "CallbackApp",
    "CallbackHTTPServer",
    "CallbackServer",
    "Refused",
    "ReplayCache",
]

RUNNING = "running"  # relay.hooks.RUNNING, without importing it
# How an event a hook undoes ended (`"EventStatus"` of a /v1/hook request with `Undoes`).
CANCELLED = "Cancelled"
UNDO_STATUSES = (CANCELLED, "Completed")

log = logging.getLogger("relay.callback")

MAX_EVENT_IDS = 100
REPLAY_CACHE_LIMIT = 100_000
MAX_NESTING = 16  # a request is an object holding a list of strings: depth 2
_differences = differences  # the name the tests of the two-field Expect know


def _nesting(body: bytes) -> int:
    """The deepest [ or { nesting outside strings. Checked before parsing because how
    deep json.loads may go before a RecursionError depends on the Python version."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


class ReplayCache:
    """Signatures seen within the timestamp window; older ones cannot verify anyway."""

    def __init__(self, window: float = MAX_SKEW_SECONDS, limit: int = REPLAY_CACHE_LIMIT) -> None:
        self._window = window
        self._limit = limit
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def first_use(self, signature: str, now: float) -> bool:
        with self._lock:
            if len(self._seen) >= self._limit // 2:
                self._seen = {s: t for s, t in self._seen.items() if t > now}
            if signature in self._seen and self._seen[signature] > now:
                return False
            if len(self._seen) >= self._limit:
                raise Refused(503, "too many signed requests; try again shortly")
            # A timestamp may lie up to `window` ahead, so remember for two windows.
            self._seen[signature] = now + 2 * self._window
            return True

    def __len__(self) -> int:
        return len(self._seen)


class CallbackApp:
    """Request handling, separate from the HTTP plumbing so it reads top to bottom.

    `clock` is what a signature's timestamp is judged by, and the replay cache's time (the
    same clock, so a replay stays refused for as long as its timestamp is fresh): the relay
    passes its clock corrected by Table storage's (relay.__main__.callback_clock), so a
    guest clock minutes off still takes approvals (issue 46)."""

    def __init__(
        self,
        keys: KeyStore,
        vm_id: str,
        vm_name: str,
        imds: ImdsClient,
        hooks: HookRunner | None = None,
        health: Callable[[], dict[str, Any]] | None = None,
        hook_wait: float = 10.0,
        clock: Callable[[], float] = time.time,
        starts: StartLog | None = None,
    ) -> None:
        self.keys = keys
        self.vm_id = vm_id.lower()
        self.key_matches = {"current": 0, "previous": 0}
        self.vm_name = vm_name
        self.imds = imds
        self.hooks = hooks
        self._health = health or (lambda: {"healthy": True})
        self.hook_wait = hook_wait
        self._clock = clock
        self.replays = ReplayCache()
        self.starts = starts  # None: AttemptId is checked but nothing is remembered

    def health(self) -> tuple[int, dict[str, Any]]:
        report = dict(self._health())
        keys = self.keys.keys()
        report["signatures"] = {
            "scheme": "v2",
            "key_id": self.keys.current_key().id,
            "previous_key_active": len(keys) > 1,
            "accepted": dict(self.key_matches),
        }
        return (200 if report.get("healthy") else 503), report

    def _verify(self, headers: dict[str, str], path: str, body: bytes, now: float) -> str:
        """The signature, if v2, for this VM, under the current or the previous key."""
        signature = verify_v2(self.keys.keys(), self.vm_id, headers, "POST", path, body, now=now)
        current = self.keys.current_key().id
        matched = "current" if headers.get(KEY_ID_HEADER.lower()) == current else "previous"
        if matched == "previous":
            event(log, logging.INFO, "signature matched the previous key", path=path)
        self.key_matches[matched] += 1
        return signature

    def post(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        route = path.split("?", 1)[0]
        if route not in ("/v1/start", "/v1/hook"):
            raise Refused(404, "no such endpoint")
        now = self._clock()
        try:
            signature = self._verify(headers, path, body, now)
        except MalformedSignature as exc:
            raise Refused(400, str(exc)) from None
        except WrongTarget:
            raise Refused(403, "signed for another VM") from None
        except SignatureError as exc:
            raise Refused(401, str(exc)) from None
        if not self.replays.first_use(signature, now):
            raise Refused(409, "replayed request")
        if _nesting(body) > MAX_NESTING:
            raise Refused(400, "body nests too deeply")
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            raise Refused(400, "body is not JSON") from None
        except RecursionError:  # e.g. 16 KiB of "[": valid-looking, but no request nests so
            raise Refused(400, "body nests too deeply") from None
        if not isinstance(payload, dict):
            raise Refused(400, "body must be a JSON object")
        if route == "/v1/start":
            return self.start(payload)
        return self.hook(payload)

    # ------------------------------------------------------------ /v1/start

    def start(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        ids = payload.get("EventIds")
        if (
            not isinstance(ids, list)
            or not ids
            or len(ids) > MAX_EVENT_IDS
            or not all(isinstance(i, str) and 0 < len(i) <= 128 for i in ids)
        ):
            raise Refused(400, f'expected {{"EventIds": [1..{MAX_EVENT_IDS} EventId strings]}}')
        if len({i.casefold() for i in ids}) != len(ids):
            raise Refused(400, "duplicate EventIds")
        try:
            expect = parse_expect(payload.get("Expect"))
        except BadExpect as exc:
            raise Refused(400, str(exc)) from None
        attempt = payload.get("AttemptId")
        if attempt is not None and not (isinstance(attempt, str) and valid_attempt_id(attempt)):
            raise Refused(400, '"AttemptId" must be 1..128 letters, digits or _.:-')
        if attempt is None or self.starts is None:
            return self._start(ids, expect)
        with self.starts.lock:  # one at a time: the same AttemptId never reaches IMDS twice
            first = self.starts.get(attempt)
            if first is None:
                status, answer = self._start(ids, expect)
                if status == 200:
                    self.starts.remember(attempt, list(answer["results"]), answer)
                return status, answer
            if sorted(i.casefold() for i in first["event_ids"]) != sorted(
                i.casefold() for i in ids
            ):
                raise Refused(409, "AttemptId already used for other EventIds")
        event(log, logging.INFO, "start repeated; IMDS not asked again", attempt_id=attempt)
        return 200, {**first["answer"], "repeated": True}

    def _start(self, ids: list[str], expect: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        document = self._fresh_document()
        checks: dict[str, str] = {}
        refusal: tuple[int, str] | None = None
        canonical: list[str] = []
        for event_id in ids:
            scheduled = document.event(event_id)
            reason = None
            if scheduled is None:
                verdict, code = "unknown EventId", 404
            elif not scheduled.affects(self.vm_name):
                verdict, code = "does not name this VM", 403
            elif not scheduled.is_scheduled:
                verdict, code = f"not Scheduled ({scheduled.event_status})", 409
            elif differing := differences(expect.get(event_id.casefold()), scheduled):
                verdict, code = "differs", 409
                reason = f"event {event_id} differs from this VM's view: {'; '.join(differing)}"
            else:
                verdict, code = "ok", 0
                canonical.append(scheduled.event_id)
            checks[event_id] = verdict
            if code and refusal is None:
                refusal = (code, reason or verdict)
        if refusal is not None:
            event(log, logging.WARNING, "start refused", reason=refusal[1], event_ids=ids)
            raise Refused(refusal[0], refusal[1], results=checks)
        try:
            status, text = self.imds.start_events(canonical)
        except ImdsError as exc:
            raise Refused(502, f"IMDS did not answer the StartRequests: {exc.kind}") from None
        outcome = "approved" if status == 200 else "failed"
        event(
            log,
            logging.INFO if status == 200 else logging.ERROR,
            "start requested",
            imds_status=status,
            event_ids=canonical,
        )
        body = {
            "imds_status": status,
            "results": {i: outcome for i in canonical},
        }
        if status != 200:
            body["imds_body"] = text[:200]
        return (200 if status == 200 else 502), body

    def _fresh_document(self) -> Any:
        try:
            _, document = self.imds.get_events()
        except ImdsError as exc:
            raise Refused(503, f"cannot read IMDS to check the request: {exc.kind}") from None
        return document

    # ------------------------------------------------------------ /v1/hook

    def hook(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name, event_id = payload.get("Hook"), payload.get("EventId")
        if not isinstance(name, str) or not isinstance(event_id, str) or not event_id:
            raise Refused(400, 'expected {"Hook": NAME, "EventId": ID}')
        if len(event_id) > 128:
            raise Refused(400, "EventId too long")
        ended = payload.get("EventStatus", CANCELLED)
        if ended not in UNDO_STATUSES:
            raise Refused(400, 'expected "EventStatus": "Completed" or "Cancelled"')
        if self.hooks is None or not self.hooks.known(name):
            raise Refused(404, "unknown hook")
        previous = self.hooks.result(name, event_id)
        from relay.hooks import public

        if previous is not None and previous.get("status") != RUNNING:
            return 200, public(previous)
        document = self._fresh_document()
        scheduled = document.event(event_id) or self._undoing(payload, event_id)
        if scheduled is None:
            raise Refused(404, "unknown EventId")
        if not scheduled.affects(self.vm_name):
            raise Refused(403, "EventId does not name this VM")
        undoes = payload.get("Undoes")
        undoes = undoes if isinstance(undoes, str) else None
        record = self.hooks.run_once(name, scheduled, wait=self.hook_wait, undoes=undoes)
        return (202 if record.get("status") == RUNNING else 200), public(record)

    def _undoing(self, payload: dict[str, Any], event_id: str) -> Any:
        """An event gone from IMDS (cancelled, or over) may still be undone here:
        `{"Undoes": HOOK}` runs the requested hook only if HOOK already ran on this VM for
        that EventId (an undrain after a drain), never for an event this relay did not act
        on. `"EventStatus"` says how it ended ("Completed" after a Freeze, Reboot or
        Redeploy, "Cancelled" if absent: an older app), the hook's SCHEDULED_EVENT_STATUS."""
        undoes = payload.get("Undoes")
        if not isinstance(undoes, str) or self.hooks is None or not self.hooks.known(undoes):
            return None
        if self.hooks.result(undoes, event_id) is None:
            return None
        from relay.models import ScheduledEvent

        event_type = str(payload.get("EventType") or "Terminate")[:64]
        status = payload.get("EventStatus", CANCELLED)  # one of UNDO_STATUSES: hook() checked
        raw = {
            "EventId": event_id,
            "EventStatus": status,
            "EventType": event_type,
            "Resources": [self.vm_name],
        }
        return ScheduledEvent(event_id, status, event_type, (self.vm_name,), raw)
