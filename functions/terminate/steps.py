"""The two kinds of drain step: the customer's HTTP drain hook and a relay hook script.

Each returns a StepResult instead of raising: a drain that fails is an outcome the policy
decides on, not an error to redeliver. Two limits bound a step (issue 40): `until`, the
drain deadline, up to which a target that cannot be reached (connection refused, 5xx, 429)
is tried again with growing waits; and `run_seconds`, how long a target that took the
request may take to answer (the HTTP hook's answer; a relay hook from its first 200/202).
So a relay that is unreachable for a while is drained once it is back, if the notice still
allows, and a hook that hangs still fails after its step timeout.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import requests
from urllib3.exceptions import ConnectTimeoutError

from functions.approvers.relay import HOOK_PATH, RelayTarget
from functions.model.event import EventSnapshot
from functions.notify.delivery import error_text
from functions.notify.webhook import sign as sign_webhook

log = logging.getLogger(__name__)

RETRY_WAIT_SECONDS = 1.0  # the first wait after a try that did not reach the target
MAX_RETRY_WAIT_SECONDS = 15.0  # waits double up to this: a relay back is met within 15 s
HOOK_REQUEST_SECONDS = 30.0  # the relay holds a hook request up to its hook_wait (10 s)
# The relay's answer to an undo (`Undoes`) for an event gone from IMDS whose drain hook
# never ran there (relay.callback): nothing was drained on that VM, so nothing to undo.
UNKNOWN_EVENT = "unknown EventId"
UNKNOWN_HOOK = "unknown hook"  # the relay's 404 for a hook name its config lacks
# How a relay hook step's detail begins when the relay has no hook of that name (its 404
# "unknown hook"): the drain then falls back to the readiness probe (plan.lacks_hook).
NO_SUCH_HOOK = f"relay refused: {UNKNOWN_HOOK}"


class StepResult(NamedTuple):
    """What one step did. `reached`: whether its receiver may have acted on it (True), or
    certainly did not (False: never delivered, a relay's refusal, which comes before it
    acts, or an undo that found nothing to undo). An undrain undoes what was reached
    (functions.terminate.plan.steps_to_undo)."""

    ok: bool
    detail: str
    reached: bool | None = None


StepOutcome = StepResult  # the name callers used


def retry_wait(attempt: int) -> float:
    """Seconds to wait after the `attempt`-th try that did not reach its target: 1, 2, 4,
    8, then every 15 s until the deadline."""
    return min(RETRY_WAIT_SECONDS * 2 ** max(attempt - 1, 0), MAX_RETRY_WAIT_SECONDS)


def never_delivered(exc: requests.RequestException) -> bool:
    """The request certainly never reached the receiver: no connection was made (refused,
    no route, name not resolved, connect timeout, TLS handshake failed). A connection lost
    after the request went out is not this: the receiver may have acted."""
    if isinstance(exc, (requests.ConnectTimeout, requests.exceptions.SSLError)):
        return True
    cause = exc.args[0] if exc.args else None
    return isinstance(getattr(cause, "reason", None), ConnectTimeoutError)


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
    run_seconds: float | None = None,
) -> StepResult:
    """POST the instances (`vms`) to the drain hook and wait for a 2xx. A try that does not
    reach the hook (no connection, 408/429/5xx) is repeated until `until`, with growing
    waits; a hook that took the request has `run_seconds` (None: until `until`) to answer.
    `scale_set_of`: Azure's scale set of each VM, read once before the first try.

    `action="undrain"` is the same request to UNDRAIN__HTTP_URL after a cancellation."""
    named = event.resources if vms is None else vms
    facts = {vm: scale_set_of(vm) for vm in named} if scale_set_of is not None else None
    attempt = 0
    last = "no attempt"
    what = f"{action} hook"
    reached = False  # the hook may have acted on some try
    while (left := _remaining(now, until)) > 0.05:
        attempt += 1
        answer_within = left if run_seconds is None else min(left, run_seconds)
        body = json.dumps(drain_request(event, until, answer_within, action, vms, facts)).encode()
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
            response = session.post(
                url, data=body, headers=headers, timeout=(min(5, left), answer_within)
            )
        except requests.RequestException as exc:
            if never_delivered(exc):
                last = f"cannot connect ({type(exc).__name__})"
            elif isinstance(exc, requests.Timeout):
                late = f"{what} did not answer within {answer_within:.0f} s"
                return StepResult(False, late, True)
            elif isinstance(exc, requests.ConnectionError):
                reached, last = True, f"connection lost ({type(exc).__name__})"
            else:
                raise
        else:
            # The hook had the request: what it did before any answer is the operator's
            # code, so an undrain asks it to undo (idempotent on webhook-id), even after a
            # refusal. Only a request never delivered is nothing to undo.
            reached = True
            status = response.status_code
            if 200 <= status < 300:
                return StepResult(True, f"{what} answered {status} (attempt {attempt})", True)
            last = f"HTTP {status}: {error_text(response)}"
            if status < 500 and status not in (408, 429):
                return StepResult(False, f"{what} refused: {last}", True)
        sleep(min(retry_wait(attempt), max(_remaining(now, until), 0)))
    return StepResult(False, f"{what} ran out of time after {attempt} attempts: {last}", reached)


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
    run_seconds: float | None = None,
) -> StepResult:
    """Ask the VM's relay to run its configured hook for this event; poll while running.

    A relay that cannot be reached (or answers 5xx/429) is asked again, with growing
    waits, until `until`; once it took the hook (its first 200 or 202), the hook has
    `run_seconds` more (None: until `until`).

    The relay runs each (hook, EventId) once and answers a repeat with the recorded result,
    so polling is the same signed request again (freshly signed: the relay refuses a
    replayed signature). The request goes to Azure's address for the VM, signed with the
    key its relay gave in an attested message and naming its vmId (scheme v2); a 401 with a
    previous key known (mid-rotation) switches to that key for the rest of this step.
    `undoes`: the drain hook this one undoes; the relay then runs it for an event gone from
    IMDS if that hook ran there, with `event_status` (how the event ended: "Cancelled", or
    "Completed" after a Freeze, Reboot or Redeploy) as its SCHEDULED_EVENT_STATUS; if it
    never ran there the relay answers 404 "unknown EventId": nothing to undo, not a failure.
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
        return StepResult(False, "no callback key known for this VM", False)
    key = keys[0]
    last = "no attempt"
    last_signed: int | None = None
    reached = False  # the relay may have started the hook
    limit = until  # until the relay takes the hook; then at most run_seconds more
    misses = 0
    while (left := _remaining(now, limit)) > 0.05:
        stamp = time.time()
        if last_signed is not None and int(stamp) == last_signed:
            sleep(1.0 - (stamp % 1) + 0.01)  # one signature per second: never a replay
            stamp = time.time()
            # That wait may have used up the step: a request now would outlive it, and
            # its timeout would replace what the relay last said with "did not answer".
            if (left := _remaining(now, limit)) <= 0.05:
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
        except requests.RequestException as exc:
            if never_delivered(exc):
                last = f"cannot reach the relay ({type(exc).__name__})"
            elif isinstance(exc, requests.Timeout):
                # A poll sent with little of the step left may time out although the relay
                # answered every earlier one: what the relay last said stays the news.
                reached = True
                if last == "hook still running":
                    last = "hook still running (the last poll got no answer in time)"
                elif not last.startswith("hook still running"):
                    last = "relay did not answer in time"
            elif isinstance(exc, requests.ConnectionError):
                reached, last = True, f"connection to the relay lost ({type(exc).__name__})"
            else:
                raise
        else:
            status = response.status_code
            answer = _json(response)
            if status in (200, 202) and limit == until and run_seconds is not None:
                limit = min(until, now() + timedelta(seconds=run_seconds))
            if status == 200:
                result = answer.get("status")
                tail = " ".join(str(answer.get("output_tail") or "").split())[-300:]
                if result == "succeeded":
                    done = f"hook {hook} succeeded" + (f": {tail}" if tail else "")
                    return StepResult(True, done, True)
                code = answer.get("exit_code")
                done = f"hook {hook} {result} (exit {code})" + (f": {tail}" if tail else "")
                return StepResult(False, done, True)
            if status == 202:
                reached, last = True, "hook still running"
                sleep(min(poll_seconds, max(_remaining(now, limit), 0)))
                continue
            reason = answer.get("error") or error_text(response)
            if status == 401 and len(keys) > 1 and key is keys[0]:
                log.warning(
                    "relay hook %s: 401 to the current key; signing with the previous", hook
                )
                key = keys[1]
                continue
            # The relay refuses before it runs anything (relay.callback): no effect.
            if status == 404 and undoes and reason == UNKNOWN_EVENT:
                nothing = f"nothing to undo: {undoes} never ran for this event on this VM"
                return StepResult(True, nothing, False)
            if 300 <= status < 400:
                why = f"relay refused ({status}): redirect not followed"
                return StepResult(False, why, reached)
            if status == 404:
                why = f"relay refused: {reason} (hooks come only from the relay's config)"
                # A relay with no hook of that name ran nothing of this step, whatever
                # became of an earlier try whose connection was lost (issue 47: carried
                # over, `reached` had the undrain ask that relay for an `undrain` hook it
                # never had, announced undrain_failed and paged). Its "unknown EventId"
                # may follow a try that started the hook, so that one keeps `reached`.
                return StepResult(False, why, reached and reason != UNKNOWN_HOOK)
            if status in (400, 401, 403):
                return StepResult(False, f"relay refused ({status}): {reason}", reached)
            last = f"HTTP {status}: {reason}"
        misses += 1
        sleep(min(retry_wait(misses), max(_remaining(now, limit), 0)))
    return StepResult(False, f"hook {hook} ran out of time: {last}", reached)


def _json(response: requests.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
