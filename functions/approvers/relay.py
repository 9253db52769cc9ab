"""The relay approver: one signed `POST {callback_url}/v1/start` to a VM's relay.

Kept apart from the approval workflow (pipeline/approve.py) so the workflow can choose
among approvers; this module only speaks the relay's callback protocol and classifies
its answer:
- approved;
- retry: network trouble, 5xx, and the 4xx whose cause may pass: 401 (signature: a key
  mid-rotation, a clock off), 403, 408, 409 (a replay, or not in its document yet), 425,
  429, and a 404 "unknown EventId" from a relay whose VM has not reported the event yet
  (its IMDS may simply lag behind a set-mate's);
- refused: a 4xx that stays true (400 malformed, 404 for an event its VM did report, so it
  left that VM's document, 405, 413, ...), or a refusal in a 200 body. A refused relay is
  not asked again for that event.
On a 401 with RELAY_KEY_PREVIOUS set, the same relay is asked once more at once, signed
with the previous key: a relay not rotated yet still approves.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Literal
from urllib.parse import urlsplit

import requests

from functions.signing import sign_headers

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 10.0
Verdict = Literal["approved", "refused", "retry"]
# 4xx answers whose cause may pass: asked again within the approval budget.
PASSING_4XX = frozenset({401, 403, 408, 409, 425, 429})
PREVIOUS_KEY_NOTE = "signed with RELAY_KEY_PREVIOUS: this relay still has the old key"


def post_start(
    callback_url: str,
    event_id: str,
    key: bytes,
    session: requests.Session,
    remaining: float,
    *,
    previous_key: bytes | None = None,
    reported: bool = True,
) -> tuple[Verdict, int | None, str]:
    """One approval attempt; `remaining` bounds the request timeout by the deadline.

    `reported`: whether this relay's VM listed the event in a document (a 404 from a relay
    that never saw it means "not yet", from one that did means "gone")."""
    verdict, status, text = _post(callback_url, event_id, key, session, remaining, reported)
    if status != 401 or previous_key is None:
        return verdict, status, text
    again = _post(callback_url, event_id, previous_key, session, remaining, reported)
    if again[1] == 401:  # neither key: a relay with some third key, or a clock off
        return verdict, status, f"{text} (RELAY_KEY_PREVIOUS too)"
    log.warning("relay %s: 401 to RELAY_KEY, %s: %s", callback_url, PREVIOUS_KEY_NOTE, again[2])
    return again[0], again[1], f"{again[2]} ({PREVIOUS_KEY_NOTE})"


def _post(
    callback_url: str,
    event_id: str,
    key: bytes,
    session: requests.Session,
    remaining: float,
    reported: bool,
) -> tuple[Verdict, int | None, str]:
    url = f"{callback_url}/v1/start"
    # The relay refuses a byte-identical request within a second as a replay; the nonce
    # keeps a quick retry (or two approvers at once) from looking like one.
    body = json.dumps({"EventIds": [event_id], "Nonce": uuid.uuid4().hex}).encode()
    path = urlsplit(url).path or "/"
    headers = {"Content-Type": "application/json", **sign_headers(key, "POST", path, body)}
    try:
        response = session.post(
            url, data=body, headers=headers, timeout=min(REQUEST_TIMEOUT_SECONDS, remaining)
        )
    except requests.RequestException as exc:
        return "retry", None, f"error: {type(exc).__name__}"
    text = reason(response)
    status = response.status_code
    if status >= 500:
        return "retry", status, f"{status} {text}"
    if status in PASSING_4XX or (status == 404 and not reported):
        return "retry", status, f"answered {status} (may pass; asking again): {text}"
    if status >= 400:
        return "refused", status, f"refused {status}: {text}"
    if status != 200:
        return "retry", status, f"unexpected {status}"
    try:
        answer = response.json()
    except ValueError:
        return "retry", 200, "200 without JSON"
    results = answer.get("results") if isinstance(answer, dict) else None
    verdict = None
    if isinstance(results, dict):
        verdict = next((v for k, v in results.items() if k.casefold() == event_id.casefold()), None)
    if verdict not in (None, "approved"):
        return "refused", 200, f"relay answered {verdict!r}"
    imds = answer.get("imds_status", answer.get("status")) if isinstance(answer, dict) else None
    return "approved", imds if isinstance(imds, int) else None, "approved"


def final_refusal(outcome: str) -> bool:
    """Whether a recorded attempt means "never ask this relay again for this event".
    Attempts recorded before the 4xx were sorted (`refused 401: ...`) count only when
    their status is one that stays true."""
    if not outcome.startswith("refused "):
        return outcome.startswith("relay answered")
    code = outcome.removeprefix("refused ").split(":", 1)[0]
    return not (code.isdigit() and int(code) in PASSING_4XX)


def reason(response: requests.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(data, dict) and "error" in data:
        return str(data["error"])[:200]
    return json.dumps(data)[:200]
