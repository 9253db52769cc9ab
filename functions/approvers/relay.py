"""The relay approver: one signed `POST {callback_url}/v1/start` to a VM's relay.

Kept apart from the approval workflow (pipeline/approve.py) so the workflow can choose
among approvers; this module only speaks the relay's callback protocol and classifies
its answer: approved, refused (4xx or a refusal in the body) or retry (network, 5xx).
"""

from __future__ import annotations

import json
import uuid
from typing import Literal
from urllib.parse import urlsplit

import requests

from functions.signing import sign_headers

REQUEST_TIMEOUT_SECONDS = 10.0
Verdict = Literal["approved", "refused", "retry"]


def post_start(
    callback_url: str, event_id: str, key: bytes, session: requests.Session, remaining: float
) -> tuple[Verdict, int | None, str]:
    """One approval attempt; `remaining` bounds the request timeout by the deadline."""
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
    if response.status_code >= 500:
        return "retry", response.status_code, f"{response.status_code} {text}"
    if response.status_code >= 400:
        return "refused", response.status_code, f"refused {response.status_code}: {text}"
    if response.status_code != 200:
        return "retry", response.status_code, f"unexpected {response.status_code}"
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


def reason(response: requests.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(data, dict) and "error" in data:
        return str(data["error"])[:200]
    return json.dumps(data)[:200]
