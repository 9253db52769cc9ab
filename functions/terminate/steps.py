"""The two kinds of drain step: the customer's HTTP drain hook and a relay hook script.

Each gets a hard time limit (its share of the time left before NotBefore) and returns
(ok, detail) instead of raising: a drain that fails is an outcome the policy decides on,
not an error to redeliver.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import requests

from functions.approvers.relay import HOOK_PATH, RelayTarget
from functions.model.event import EventSnapshot
from functions.notify.delivery import error_text
from functions.notify.webhook import sign as sign_webhook

log = logging.getLogger(__name__)

StepOutcome = tuple[bool, str]
RETRY_WAIT_SECONDS = 1.0
HOOK_REQUEST_SECONDS = 30.0  # the relay holds a hook request up to its hook_wait (10 s)


def _remaining(now: Callable[[], datetime], until: datetime) -> float:
    return (until - now()).total_seconds()


# VM name -> Azure's scale set for it (the VM row, from Resource Graph): the set's name,
# "" when Azure says it is in none, None when the app has no row for it.
ScaleSetOf = Callable[[str], str | None]


def instance_scale_set(vm: str, sets: tuple[str, ...], fact: str | None) -> str | None:
    """The scale set to name for `vm` in a drain request: Azure's fact when the app has
    one; without it, the longest of the event's sets whose instance names `vm` can be
    (`<set>_<instance id>`), so that with sets `app` and `app_x`, `app_x_5` is `app_x`'s."""
    if fact is not None:
        return fact or None
    folded = vm.casefold()
    owners = [s for s in sets if folded.startswith(f"{s}_".casefold())]
    return max(owners, key=len, default=None)


def drain_request(
    event: EventSnapshot,
    deadline: datetime,
    timeout: float,
    action: str = "drain",
    vms: tuple[str, ...] | None = None,
    facts: dict[str, str | None] | None = None,
) -> dict[str, Any]:
    """What the customer's drain (or undrain) hook receives: the event and the instances
    to drain: `vms`, the named VMs whose own view decided drain (functions.terminate.
    targets), never a name only a set-mate's view put there. `Resources` lists the same
    names, so a hook that reads either drains only those. `facts`: each VM's scale set as
    Azure says (ScaleSetOf); a VM not in it is labelled by name (instance_scale_set)."""
    names = list(event.resources if vms is None else vms)
    facts = facts or {}
    return {
        "action": action,
        "EventId": event.event_id,
        "EventType": event.event_type,
        "NotBefore": event.imds_fields()["NotBefore"],
        "Resources": names,
        "ScaleSets": list(event.scale_sets),
        "instances": [
            {
                "name": vm,
                "scale_set": instance_scale_set(vm, event.scale_sets, facts.get(vm)),
            }
            for vm in names
        ],
        "drain_deadline": deadline.isoformat(),
        "timeout_seconds": round(timeout, 1),
    }


def http_drain(
    session: requests.Session,
    url: str,
    event: EventSnapshot,
    until: datetime,
    now: Callable[[], datetime],
    sleep: Callable[[float], None],
    secret: bytes | tuple[bytes, ...] | None = None,
    action: str = "drain",
    vms: tuple[str, ...] | None = None,
    scale_set_of: ScaleSetOf | None = None,
) -> StepOutcome:
    """POST the instances (`vms`) to the drain hook and wait for a 2xx, retrying 429/5xx
    in time. `scale_set_of`: Azure's scale set of each VM, read once before the first try.

    `action="undrain"` is the same request to UNDRAIN__HTTP_URL after a cancellation."""
    named = event.resources if vms is None else vms
    facts = {vm: scale_set_of(vm) for vm in named} if scale_set_of is not None else None
    attempt = 0
    last = "no attempt"
    what = f"{action} hook"
    while (left := _remaining(now, until)) > 0.05:
        attempt += 1
        body = json.dumps(drain_request(event, until, left, action, vms, facts)).encode()
        # One id for every retry of this step and for a rerun after a crash, signed or
        # not: a hook that may be called twice (a lost answer) dedupes by it.
        step_id = f"{event.event_id}:{action}"
        headers = {
            "Content-Type": "application/json",
            "X-Bridge-Event-Id": event.event_id,
            "webhook-id": step_id,
        }
        if secret:
            # Standard Webhooks, like the webhook channel.
            headers.update(sign_webhook(secret, step_id, body))
        try:
            response = session.post(url, data=body, headers=headers, timeout=(min(5, left), left))
        except requests.Timeout:
            return False, f"{what} did not answer within {left:.0f} s"
        except requests.ConnectionError as exc:
            last = f"cannot connect ({type(exc).__name__})"
        else:
            if 200 <= response.status_code < 300:
                return True, f"{what} answered {response.status_code} (attempt {attempt})"
            last = f"HTTP {response.status_code}: {error_text(response)}"
            if response.status_code < 500 and response.status_code not in (408, 429):
                return False, f"{what} refused: {last}"
        sleep(min(RETRY_WAIT_SECONDS * attempt, max(_remaining(now, until), 0)))
    return False, f"{what} ran out of time after {attempt} attempts: {last}"


def relay_hook(
    session: requests.Session,
    target: RelayTarget,
    hook: str,
    event_id: str,
    until: datetime,
    now: Callable[[], datetime],
    sleep: Callable[[float], None],
    poll_seconds: float = 2.0,
    undoes: str | None = None,
    event_type: str | None = None,
    event_status: str = "Cancelled",
) -> StepOutcome:
    """Ask the VM's relay to run its configured hook for this event; poll while running.

    The relay runs each (hook, EventId) once and answers a repeat with the recorded result,
    so polling is the same signed request again (freshly signed: the relay refuses a
    replayed signature). The request goes to Azure's address for the VM, signed with the
    key its relay gave in an attested message and naming its vmId (scheme v2); a 401 with a
    previous key known (mid-rotation) switches to that key for the rest of this step.
    `undoes`: the drain hook this one undoes; the relay then runs it for an event gone from
    IMDS if that hook ran there, with `event_status` (how the event ended: "Cancelled", or
    "Completed" after a Freeze, Reboot or Redeploy) as its SCHEDULED_EVENT_STATUS.
    """
    url = f"{target.url.rstrip('/')}{HOOK_PATH}"
    request: dict[str, str] = {"Hook": hook, "EventId": event_id}
    if undoes:
        request.update(
            {
                "Undoes": undoes,
                "EventType": event_type or "Terminate",
                "EventStatus": event_status,
            }
        )
    body = json.dumps(request).encode()
    keys = list(target.keys)
    if not keys:
        return False, "no callback key known for this VM"
    key = keys[0]
    last = "no attempt"
    last_signed: int | None = None
    while (left := _remaining(now, until)) > 0.05:
        stamp = time.time()
        if last_signed is not None and int(stamp) == last_signed:
            sleep(1.0 - (stamp % 1) + 0.01)  # one signature per second: never a replay
            stamp = time.time()
            # That wait may have used up the step: a request now would outlive it, and
            # its timeout would replace what the relay last said with "did not answer".
            if (left := _remaining(now, until)) <= 0.05:
                break
        last_signed = int(stamp)
        headers = target.signed(key, HOOK_PATH, body, now=stamp)
        try:
            response = session.post(
                url,
                data=body,
                headers=headers,
                timeout=(min(5, left), min(left, HOOK_REQUEST_SECONDS)),
                allow_redirects=False,
            )
        except requests.Timeout:
            # A poll sent with little of the step left may time out although the relay
            # answered every earlier one: what the relay last said stays the news.
            if last == "hook still running":
                last = "hook still running (the last poll got no answer in time)"
            elif not last.startswith("hook still running"):
                last = "relay did not answer in time"
        except requests.ConnectionError as exc:
            last = f"cannot reach the relay ({type(exc).__name__})"
        else:
            status = response.status_code
            answer = _json(response)
            if status == 200:
                result = answer.get("status")
                tail = " ".join(str(answer.get("output_tail") or "").split())[-300:]
                if result == "succeeded":
                    return True, f"hook {hook} succeeded" + (f": {tail}" if tail else "")
                code = answer.get("exit_code")
                return False, f"hook {hook} {result} (exit {code})" + (f": {tail}" if tail else "")
            if status == 202:
                last = "hook still running"
                sleep(min(poll_seconds, max(_remaining(now, until), 0)))
                continue
            reason = answer.get("error") or error_text(response)
            if status == 401 and len(keys) > 1 and key is keys[0]:
                log.warning(
                    "relay hook %s: 401 to the current key; signing with the previous", hook
                )
                key = keys[1]
                continue
            if 300 <= status < 400:
                return False, f"relay refused ({status}): redirect not followed"
            if status == 404:
                return False, f"relay refused: {reason} (hooks come only from the relay's config)"
            if status in (400, 401, 403):
                return False, f"relay refused ({status}): {reason}"
            last = f"HTTP {status}: {reason}"
        sleep(min(RETRY_WAIT_SECONDS, max(_remaining(now, until), 0)))
    return False, f"hook {hook} ran out of time: {last}"


def _json(response: requests.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def budget(now: datetime, deadline: datetime, step_timeout: float) -> datetime:
    """When one step must stop: its own limit, or the workflow's deadline if sooner."""
    return min(now + timedelta(seconds=step_timeout), deadline)
