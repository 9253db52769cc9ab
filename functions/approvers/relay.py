"""The relay approver: one signed `POST http://{VM address}:{port}/v1/start` to a VM's relay.

Kept apart from the approval workflow (pipeline/approve.py) so the workflow can choose
among approvers; this module only speaks the relay's callback protocol and classifies
its answer:
- approved: only an explicit `results[EventId] == "approved"` with `imds_status` 200 (the
  relay's own IMDS accepted the StartRequests). Anything short of that is not an approval;
- retry: network trouble, 5xx, and the 4xx whose cause may pass: 401 (signature: a key
  mid-rotation, a clock off), 403, 408, 409 (a replay, or not in its document yet), 425,
  429, and a 404 "unknown EventId" from a relay whose VM has not reported the event yet
  (its IMDS may simply lag behind a set-mate's);
- differs: a 409 whose verdict for the event is "differs": the relay's own IMDS shows the
  event otherwise than the view the decision rests on (`Expect`). That is final for the
  whole event: no other relay and no ARM is asked (functions.pipeline.approve);
- refused: a 4xx that stays true (400 malformed, 404 for an event its VM did report, so it
  left that VM's document, 405, 413, ...), a redirect (never followed: the address is
  Azure's, so a redirect means something else answers there), or a refusal in a 200 body.
  A refused relay is not asked again for that event.

Where the request goes and how it is signed comes from the app alone (RelayTarget): the
address Azure gives the VM's NIC, the bridge's one port and path, and the key that VM's
relay gave in an attested message, naming the VM's vmId as the target (scheme v2). On a 401
the target's next key is tried once: a relay mid-rotation still approves. Which keys, in
which order, is functions.pipeline.anchor's: the relay's anchor alone while it heartbeats
under it, never a key a local user enrolled (issue 46).
The request also carries the view the policy decided on (`Expect`, functions/model/view.py:
type, source, duration, NotBefore, Resources): a relay whose own IMDS shows the event
otherwise refuses, so a set-mate's report that disagrees with the VM's own view cannot steer
an approval.

StartRequests at most once per VM and event (issue 31): each request carries an
`AttemptId` derived from the VM's vmId and the EventId alone (`start_attempt_id`), so it is
the same on every try, after a crash of the app and a redelivery too. A relay remembers the
attempts whose StartRequests its IMDS accepted and answers a repeat from memory (`"repeated":
true`) without a second StartRequests, so a crash after the relay's 200, or a lost answer,
never approves twice; it remembers no failure, so a retry after an IMDS 5xx or a refusal
still reaches IMDS. Nothing of the claim or the time goes in: a redelivery claims anew and
must still be recognised. Relays before this ignore the field.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import requests

from functions.deadline import exchange
from functions.identity.keys import CallbackKey
from functions.signing import sign_headers_v2

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 10.0
START_PATH = "/v1/start"
HOOK_PATH = "/v1/hook"
Verdict = Literal["approved", "refused", "retry", "differs"]
# 4xx answers whose cause may pass: asked again within the approval budget.
PASSING_4XX = frozenset({401, 403, 408, 409, 425, 429})
PREVIOUS_KEY_NOTE = "signed with the relay's previous key: it has not rotated yet"
MAX_ANSWER_CHARS = 200
DIFFERS = "view differs"  # how a "differs" answer's attempt is recorded (relay_phase reads it)
MAX_EXPECT_RESOURCES = 100  # 100 names of up to 64 characters: 7 KiB of a 16 KiB body
ATTEMPT_PREFIX = "sa1-"  # the scheme of start_attempt_id, should it ever change


def start_attempt_id(vm_id: str, event_id: str) -> str:
    """The `AttemptId` of every /v1/start for this VM and event: stable across retries,
    crashes and redeliveries (a hash of the two; the relay compares it as a string)."""
    material = f"start-attempt/v1\n{vm_id.lower()}\n{event_id.casefold()}".encode()
    return ATTEMPT_PREFIX + hashlib.sha256(material).hexdigest()[:32]


@dataclass(frozen=True)
class RelayTarget:
    """One VM's relay as the app knows it: Azure's address, the VM's vmId, its keys."""

    url: str  # http://ADDRESS:PORT, from Azure's facts; never from a relay
    vm_id: str
    keys: tuple[CallbackKey, ...]  # in the order to try (functions.pipeline.anchor)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or parts.path not in ("", "/") or parts.query:
            raise ValueError(f"relay target must be http(s)://HOST:PORT, got {self.url!r}")

    def signed(
        self, key: CallbackKey, path: str, body: bytes, now: float | None = None
    ) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            **sign_headers_v2(key.secret, key.key_id, self.vm_id, "POST", path, body, now=now),
        }


def post_start(
    target: RelayTarget,
    event_id: str,
    session: requests.Session,
    remaining: float,
    *,
    reported: bool = True,
    expect: Mapping[str, Any] | None = None,
) -> tuple[Verdict, int | None, str]:
    """One approval attempt; `remaining` bounds the request timeout by the deadline.

    `reported`: whether this relay's VM listed the event in a document (a 404 from a relay
    that never saw it means "not yet", from one that did means "gone"). `expect`: the view
    the decision rests on (`VmView.expect()`)."""
    if not target.keys:
        return "refused", None, "no callback key known for this VM"
    verdict, status, text = _post(
        target, target.keys[0], event_id, session, remaining, reported, expect
    )
    if status != 401 or len(target.keys) < 2:
        return verdict, status, text
    again = _post(target, target.keys[1], event_id, session, remaining, reported, expect)
    if again[1] == 401:  # neither key: a relay with some third key, or a clock off
        return verdict, status, f"{text} (previous key too)"
    log.warning("relay %s: 401 to its current key, %s: %s", target.url, PREVIOUS_KEY_NOTE, again[2])
    return again[0], again[1], f"{again[2]} ({PREVIOUS_KEY_NOTE})"


def _post(
    target: RelayTarget,
    key: CallbackKey,
    event_id: str,
    session: requests.Session,
    remaining: float,
    reported: bool,
    expect: Mapping[str, Any] | None,
) -> tuple[Verdict, int | None, str]:
    url = f"{target.url.rstrip('/')}{START_PATH}"
    # The relay refuses a byte-identical request within a second as a replay; the nonce
    # keeps a quick retry (or two approvers at once) from looking like one.
    request: dict[str, object] = {
        "EventIds": [event_id],
        "Nonce": uuid.uuid4().hex,
        "AttemptId": start_attempt_id(target.vm_id, event_id),
    }
    if expect:
        request["Expect"] = {event_id: wire_expect(expect)}
    body = json.dumps(request).encode()
    headers = target.signed(key, START_PATH, body)
    try:
        # The whole exchange within its time (functions.deadline): a relay that answers one
        # byte a second costs its own event this attempt, nobody else's.
        response = exchange(
            "POST",
            url,
            seconds=min(REQUEST_TIMEOUT_SECONDS, remaining),
            session=session,
            data=body,
            headers=headers,
        )
    except requests.RequestException as exc:
        return "retry", None, f"error: {type(exc).__name__}"
    text = reason(response)
    status = response.status_code
    if 300 <= status < 400:
        return "refused", status, f"refused {status}: redirect not followed"
    if status >= 500:
        return "retry", status, f"{status} {text}"
    if status == 409 and _answered(response, event_id) == "differs":
        return "differs", status, f"{DIFFERS} (409): {text}"
    if status in PASSING_4XX or (status == 404 and not reported):
        return "retry", status, f"answered {status} (may pass; asking again): {text}"
    if status >= 400:
        return "refused", status, f"refused {status}: {text}"
    if status != 200:
        return "retry", status, f"unexpected {status}"
    return _verdict(response, event_id)


def wire_expect(expect: Mapping[str, Any]) -> dict[str, Any]:
    """The `Expect` entry as relays read it: an unknown EventSource is "" (what a relay
    sees for an IMDS event without one; a relay of before issue 27 refuses a null there),
    a DurationInSeconds of null means "IMDS gives none". Resources is left out for an event
    naming more than MAX_EXPECT_RESOURCES VMs: the request must stay within the relay's
    16 KiB body limit (those VMs' relays then compare every other field)."""
    wire = {k: v for k, v in expect.items() if v is not None or k == "DurationInSeconds"}
    if "EventSource" in expect and expect["EventSource"] is None:
        wire["EventSource"] = ""
    if len(wire.get("Resources") or ()) > MAX_EXPECT_RESOURCES:
        wire.pop("Resources")
    return wire


def _answered(response: requests.Response, event_id: str) -> object:
    """The relay's verdict for this EventId in a refusal's `results`, if it gave one."""
    try:
        results = response.json().get("results")
    except (ValueError, AttributeError):
        return None
    if not isinstance(results, dict):
        return None
    return next((v for k, v in results.items() if k.casefold() == event_id.casefold()), None)


def _verdict(response: requests.Response, event_id: str) -> tuple[Verdict, int | None, str]:
    """Approved only when the relay says so for this EventId and IMDS answered 200."""
    try:
        answer = response.json()
    except ValueError:
        return "refused", 200, "relay answered 'no verdict' (200 without JSON)"
    if not isinstance(answer, dict):
        return "refused", 200, "relay answered 'no verdict' (200 without an object)"
    results = answer.get("results")
    verdict = None
    if isinstance(results, dict):
        verdict = next((v for k, v in results.items() if k.casefold() == event_id.casefold()), None)
    if verdict is None:
        return "refused", 200, "relay answered 'no verdict' for this event"
    if verdict != "approved":
        return "refused", 200, f"relay answered {clip(str(verdict))!r}"
    imds = answer.get("imds_status")
    if imds != 200 or isinstance(imds, bool):
        return (
            "retry",
            imds if isinstance(imds, int) else None,
            f"approved, but IMDS said {clip(str(imds))}",
        )
    return "approved", 200, "approved"


def clip(text: str, limit: int = MAX_ANSWER_CHARS) -> str:
    """Callee text as one printable line: it goes into audit rows and announcements."""
    printable = "".join(c if c.isprintable() else " " for c in text)
    return " ".join(printable.split())[:limit]


def reason(response: requests.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return clip(response.text)
    if isinstance(data, dict) and "error" in data:
        return clip(str(data["error"]))
    return clip(json.dumps(data))
