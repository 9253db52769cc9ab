"""Human words shared by every channel, so Teams, PagerDuty and webhooks say the same thing."""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime

from functions.model.event import Decision, EventSnapshot, Notification, Transition, utc_text

MAX_LISTED = 20  # VMs named per group before "and N more": a card must stay readable


def plain(text: str) -> str:
    """One line of printable text: control characters (newlines, escapes, NUL, C1) and
    invisible format characters (bidi overrides, zero-width ones) become spaces, runs of
    whitespace one space. Text from VMs (names, EventIds, Descriptions, relay answers)
    passes through this before any summary or card carries it."""
    cleaned = "".join(
        " " if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") else ch for ch in text
    )
    return " ".join(cleaned.split())


ZWSP = "\u200b"
# What linkifiers take for a link, in any script: a host name (a.b, the dot after any letter,
# digit or mark: `microsoftonlin\u00e8.com` is one), an e-mail address (a@b), a scheme
# (http:, after any letter). IDNA reads the ideographic and full-width full stops, the
# full-width @ and : as theirs, so they count too. Colons after a digit stay (10:30 is a
# time, not a scheme). Applied after `plain`, which has turned any zero-width character
# already in the text into a space.
LINKY = re.compile(r"(?<=\S)[.\u3002\uff0e\uff61@\uff20](?=\w)|(?<=[^\s\d])[:\uff1a](?=[\w/\\])")


def unlinked(text: str) -> str:
    """`text` with every place a linkifier would start or join a link broken by a zero-width
    space (invisible in a card or a Slack message, and no link any more)."""
    return LINKY.sub(lambda m: m[0] + ZWSP, text)


# What phones take for a number to call: digits (any script's) joined by the punctuation
# libphonenumber reads inside one (PhoneNumberMatcher's VALID_PUNCTUATION: spaces, dashes,
# dots, slashes, brackets, tildes, an "x", the zero-width and full-width ones), at least
# PHONE_DIGITS of them: the shortest subscriber numbers many countries dial. Android's
# Linkify's phone pattern reads a subset of these runs. The bridge's own times
# (`2026-11-15 10:30:00 UTC`, `utc_text`, and ISO's `T`) are left whole, as libphonenumber
# itself drops a date followed by a time (its TIME_STAMPS pattern).
PHONE_DIGITS = 7
PHONE_GROUP = 4  # digits a defanged number keeps together: short of any number to call
_PHONE_PUNCT = (
    "\\s\\-x\u2010-\u2015\u2212\u30fc\uff0d-\uff0f\u00ad\u200b\u2060()"
    "\uff08\uff09\uff3b\uff3d.\\[\\]/~\u2053\u223c\uff5e"
)
PHONEY = re.compile(
    r"(?P<stamp>[12]\d{3}-[01]\d-[0-3]\d[ T][0-2]\d:[0-5]\d)|\d(?:[" + _PHONE_PUNCT + r"]*\d)+"
)
PHONE_BREAK = "\u00b7"  # a middle dot: no punctuation of a number, for either of them


def undialable(text: str) -> str:
    """`text` with every run a phone would offer to call (PHONEY) broken into groups of at
    most PHONE_GROUP digits by a visible middle dot (`+1·800·555·0199`), its punctuation
    dropped: still readable, never one tap from a call. For titles and PagerDuty's summary,
    which reach a phone's lock screen, an SMS or a voice call, where a VM's EventType, set
    name or Description could otherwise carry "call +1 (800) 555-0199 to approve"."""
    return PHONEY.sub(_phone_broken, text)


def _phone_broken(match: re.Match[str]) -> str:
    digits = [ch for ch in match[0] if ch.isdecimal()]
    if match["stamp"] or len(digits) < PHONE_DIGITS:
        return match[0]
    groups: list[str] = []
    for block in re.findall(r"\d+", match[0]):
        groups += [block[i : i + PHONE_GROUP] for i in range(0, len(block), PHONE_GROUP)]
    return PHONE_BREAK.join(groups)


def defanged(text: str) -> str:
    """`text` on one line with the same places bracketed (`evil[.]example`, `a[@]b`,
    `https[:]//`): the usual defanging, for a PagerDuty summary that reaches an SMS or a
    phone call, where a zero-width space may be dropped or spoken and the link come back;
    and no number to call (`undialable`)."""
    return LINKY.sub(lambda m: f"[{m[0]}]", undialable(plain(text)))


def event_words(event: EventSnapshot) -> str:
    """The event type in words an operator reads at a glance."""
    kind = event.event_type
    seconds = event.duration_in_seconds
    if kind == "Freeze":
        if seconds is not None and seconds > 0:
            return f"Live migration pause {seconds} s"
        if seconds == 0:
            return "Freeze (no impact expected)"
        return "Live migration pause"
    words = {
        "Reboot": "Reboot",
        "Redeploy": "Redeploy (moves to another host, temporary disk lost)",
        "Preempt": "Spot eviction",
        "Terminate": "Scale-in: instance deleted",
    }.get(kind, kind)
    if seconds is not None and seconds > 0 and kind in {"Reboot", "Redeploy"}:
        words += f", about {seconds} s"
    return words


def relative(moment: datetime | None, now: datetime) -> str:
    """'in 12 min', '3 min ago', 'now': the When an operator acts on."""
    if moment is None:
        return "now"
    seconds = (moment - now).total_seconds()
    span = abs(seconds)
    if span < 30:
        return "now"
    if span < 3600:
        text = f"{round(span / 60)} min"
    elif span < 48 * 3600:
        hours, rest = divmod(round(span / 60), 60)
        text = f"{hours} h {rest} min" if rest else f"{hours} h"
    else:
        text = f"{round(span / 86400)} days"
    return f"in {text}" if seconds > 0 else f"{text} ago"


def when_text(event: EventSnapshot, now: datetime) -> str:
    if event.not_before is None:
        return "now (already started)" if event.event_status == "Started" else "not given"
    return f"{utc_text(event.not_before)} ({relative(event.not_before, now)})"


def vm_groups(event: EventSnapshot) -> list[tuple[str, list[str]]]:
    """VMs grouped by scale set (instance names are `{set}_{id}`) or availability set."""
    left = list(event.resources or event.reported_by)
    groups: list[tuple[str, list[str]]] = []
    for scale_set in sorted(event.scale_sets, key=len, reverse=True):
        members = [vm for vm in left if vm.startswith(f"{scale_set}_")]
        if members:
            groups.append((f"Scale set {scale_set}", members))
            left = [vm for vm in left if vm not in members]
    if left:
        if len(event.availability_sets) == 1:
            groups.append((f"Availability set {event.availability_sets[0]}", left))
        else:
            groups.append(("VMs", left))
    return groups


def listed(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    more = len(names) - MAX_LISTED
    return f"{shown} and {more} more" if more > 0 else shown


def vms_text(event: EventSnapshot) -> str:
    parts = [f"{label}: {listed(names)}" for label, names in vm_groups(event)]
    if event.unlisted:
        parts.append(f"and {event.unlisted} more not listed")
    return "; ".join(parts) or "none named"


def vm_count(event: EventSnapshot) -> str:
    count = len(event.resources or event.reported_by) + event.unlisted
    return f"{count} VM" if count == 1 else f"{count} VMs"


ACTION_WORDS = {
    "approve": "Approve now",
    "drain": "Drain, then approve",
    "hold": "Hold: let NotBefore arrive",
}


def decision_text(decision: Decision) -> str:
    text = f"{ACTION_WORDS.get(decision.action, decision.action)} (rule {decision.rule})"
    if decision.approve_after is not None:
        text += f", approve after {utc_text(decision.approve_after)}"
    reason = _beyond_the_rule(decision)
    if reason:
        text += f": {reason}"
    if decision.dry_run:
        text += " [dry run: nothing is approved]"
    if decision.policy_error:
        text += f" [policy invalid, failing closed: {decision.policy_error}]"
    return text


def _beyond_the_rule(decision: Decision) -> str:
    """The reason, less what the text already says: the policy writes "rule 'x': hold",
    which would repeat the rule and the action a third time."""
    reason = decision.reason.removeprefix(f"rule {decision.rule!r}: ")
    return "" if reason in ("", decision.action) else reason


# How the drain workflow's drain_started detail begins when neither DRAIN__HTTP_URL nor
# DRAIN__RELAY_HOOK is set (functions.terminate.workflow): the event is held, not drained.
NO_DRAIN_STEP = "no drain step configured"

# How the drain_started detail names VMs with no working drain (functions.model.drains).
NO_DRAIN = "no drain on this VM"


def _no_drain_state(detail: str, state: str) -> str:
    """A drain_started card's state when some VM has no working drain: held (a Platform
    event) or approved at once (a User event), never "draining" for what is not drained."""
    if detail.startswith(NO_DRAIN_STEP):
        return "not drained: no drain step configured"  # the workflow holds it instead
    then = "approved at once" if f"{NO_DRAIN}: approved at once" in detail else "held"
    if detail.startswith(NO_DRAIN):
        return f"not drained: {NO_DRAIN}: {then}"
    if f"; {NO_DRAIN}: " in detail:
        return f"draining the VMs that have a drain, then {then}: {NO_DRAIN} on others"
    return state


FOLLOW_UP = {
    Transition.SCHEDULED: "scheduled",
    Transition.DECIDED: "scheduled",
    Transition.APPROVED: "approved: it can start now",
    Transition.APPROVAL_FAILED: "approval failed: it starts at NotBefore",
    Transition.DRAIN_STARTED: "draining before approval",
    Transition.DRAIN_FAILED: "drain failed",
    Transition.STARTED: "started",
    Transition.COMPLETED: "completed",
    Transition.CANCELLED: "cancelled by Azure before it started",
    Transition.OVERDUE: "overdue: still Scheduled after NotBefore",
    Transition.UNDRAINED: "over or cancelled after its drain: undrained, back in service",
    Transition.UNDRAIN_FAILED: "over or cancelled after its drain, but undraining failed",
}


def headline(note: Notification) -> str:
    """One line naming the transition, the event and the VMs: the title of every channel's
    post and the start of PagerDuty's summary. On one line, with no number to call in it
    (`undialable`): a VM's EventType, set or VM name could carry one."""
    return undialable(plain(_headline(note)))


def _headline(note: Notification) -> str:
    if note.transition is Transition.RELAY_SILENT and note.silent_group:
        return f"Relays of {note.silent_count} VMs in {note.silent_label} stopped reporting"
    if note.transition is Transition.RELAY_SILENT:
        return f"Relay on {note.vm or 'a VM'} stopped reporting"
    if note.transition is Transition.RELAY_RECOVERED:
        return f"Relay on {note.vm or 'a VM'} is reporting again"
    if note.transition is Transition.POLICY_INVALID:
        return "Approval policy is invalid: nothing is approved until it is fixed"
    if note.transition is Transition.POLICY_VALID:
        return "Approval policy is valid again: events are decided and approved"
    if note.transition is Transition.CONFIG_INVALID:
        return f"Azure refuses the app's {note.vm or 'request'}: new VMs cannot be admitted"
    if note.transition is Transition.CONFIG_VALID:
        return f"Azure answers the app's {note.vm or 'request'} again"
    event = note.event
    if event is None:
        return f"{note.transition.value} ({note.vm or 'fleet'})"
    what = event_words(event)
    state = FOLLOW_UP.get(note.transition, note.transition.value)
    if (
        note.transition in (Transition.SCHEDULED, Transition.DECIDED)
        and event.event_status == "Started"
    ):
        state = "already started (no notice)"  # a host failure skips Scheduled
    if note.transition is Transition.DRAIN_STARTED:
        state = _no_drain_state(note.detail or "", state)
    groups = vm_groups(event)
    where = vm_count(event)
    if len(groups) == 1:
        label = groups[0][0]
        where += f" in {label[0].lower()}{label[1:]}" if label != "VMs" else ""
    return f"{what} {state}: {where}"


def other_facts(
    note: Notification, event: EventSnapshot | None, now: datetime
) -> list[tuple[str, str | None]]:
    """The facts of a post that is not an event's transition (a fleet or policy note), the
    same on every channel: which VMs and when if it names an event, else the VM, then any
    policy error and the time it happened."""
    pairs: list[tuple[str, str | None]] = []
    if event is not None:
        pairs += [
            ("VMs", vms_text(event)),
            ("When", when_text(event, now)),
            ("Waiting", note.waiting or None),
            ("Event", event.event_id),
        ]
    if note.vm and event is None:
        pairs.append(("VM", note.vm))
    if note.decision and note.decision.policy_error:
        pairs.append(("Policy error", note.decision.policy_error))
    pairs.append(("At", utc_text(note.occurred_at)))
    return pairs
