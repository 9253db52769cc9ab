"""The approval policy: ordered rules edited in app settings, windows, paging, capacity.

The policy is data (pydantic models read from `POLICY__*` app settings) and `decide()` is a
pure function of the policy, the event and the time, so an operator can check a policy with
`python -m functions policy explain` before deploying it and get exactly the answer the
function app would give. State-dependent checks (the capacity guard) live in the ingest
pipeline, which owns the store.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from datetime import datetime, time, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from functions.model.budgets import Budget, lint_budgets, per_set_notes
from functions.model.drains import NO_DRAIN, DrainKind
from functions.model.envelope import (
    FREEZE,
    PREEMPT,
    REBOOT,
    REDEPLOY,
    TERMINATE,
    USER,
    ScheduledEvent,
)
from functions.model.event import Action, Decision, Severity, Transition
from functions.model.match import (
    EVENT_TYPES,
    IMPACT_FREE_BELOW_SECONDS,
    SOURCES,
    STATUSES,
    Match,
    _in,
    closed_set,
    is_impactful,
)
from functions.model.match import quoted as _quoted
from functions.model.policy_lint import lint_rules
from functions.setting_names import env_names, error_message, suggestion

__all__ = [
    "EVENT_TYPES",
    "IMPACT_FREE_BELOW_SECONDS",
    "SOURCES",
    "STATUSES",
    "Budget",
    "Match",
    "closed_set",
    "is_impactful",
]

# The drain kind of a VM with no working drain (functions.model.drains.drain_for); what
# the policy says of it is drains.NO_DRAIN (the card, `policy explain` and the pages).
NO_DRAIN_KIND: DrainKind = "none"
NO_DRAIN_TEXT = NO_DRAIN
ALL_CHANNELS: tuple[str, ...] = ("teams", "pagerduty", "webhook", "slack")
Weekday = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
WEEKDAYS: tuple[str, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


class Rule(BaseModel):
    """One policy rule. The first rule whose match holds decides the event."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64)
    match: Match = Match()
    action: Action
    channels: tuple[str, ...] = ALL_CHANNELS
    severity: Severity = "warning"
    page: bool | None = None  # None: the policy's paging defaults decide
    ignore_windows: bool = False  # approve at once even outside maintenance windows

    @field_validator("channels")
    @classmethod
    def _known_channels(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(ALL_CHANNELS))
        if unknown:
            raise ValueError(f"unknown channel(s) {unknown}; known: {list(ALL_CHANNELS)}")
        return value


class Window(BaseModel):
    """A weekly maintenance window, e.g. Sat 01:00-05:00 in the policy's time zone.

    `end` at or before `start` means the window runs past midnight into the next day;
    "24:00" is accepted as the end of the day.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    days: tuple[Weekday, ...] = Field(min_length=1)
    start: str
    end: str

    @field_validator("start", "end")
    @classmethod
    def _clock_time(cls, value: str) -> str:
        _minutes(value)
        return value

    def openings(self, around: datetime, zone: ZoneInfo) -> list[tuple[datetime, datetime]]:
        """The window's occurrences starting from 8 days before to 8 days after `around`."""
        local = around.astimezone(zone)
        start_m, end_m = _minutes(self.start), _minutes(self.end)
        length = end_m - start_m if end_m > start_m else end_m + 24 * 60 - start_m
        spans = []
        for offset in range(-8, 9):
            day = (local + timedelta(days=offset)).date()
            if WEEKDAYS[day.weekday()] not in self.days:
                continue
            opens = datetime.combine(day, time(0), tzinfo=zone) + timedelta(minutes=start_m)
            # Wall-clock arithmetic in the zone, then normalized: DST days keep their hours.
            opens = opens.replace(tzinfo=None).replace(tzinfo=zone)
            spans.append((opens, opens + timedelta(minutes=length)))
        return spans


def _minutes(text: str) -> int:
    try:
        hours, minutes = text.split(":")
        h, m = int(hours), int(minutes)
    except ValueError:
        raise ValueError(f"{text!r} is not a time like 01:30") from None
    if not (0 <= h <= 24 and 0 <= m < 60) or (h == 24 and m != 0):
        raise ValueError(f"{text!r} is not a time between 00:00 and 24:00")
    return h * 60 + m


def default_rules() -> tuple[Rule, ...]:
    """Drain, then approve, every disruptive event (issue 45): a short Freeze is approved
    at once; a Terminate, and every Reboot, Redeploy, Preempt and Freeze of 9 s or more,
    Platform or User, is drained, then approved. A held event is started by Azure at
    NotBefore with no drain, so the VM would go while still serving: `hold` is opt-in.

    A VM with no working drain (`decide`'s `drain="none"`) gets Microsoft's sample: its
    Platform events are held to NotBefore and its User events approved at once (`no_drain`).
    """
    return (
        Rule(
            name="short-freeze",
            match=Match(event_types=(FREEZE,), duration_at_least=0, duration_below=9),
            action="approve",
            severity="info",
            ignore_windows=True,
        ),
        Rule(
            name="terminate-drain",
            match=Match(event_types=(TERMINATE,)),
            action="drain",
            severity="warning",
        ),
        Rule(name="drain-then-approve", action="drain", severity="warning"),
    )


def sample_rules() -> tuple[Rule, ...]:
    """Microsoft's sample policy (the seed's), with Terminate first: opt-in `hold`, the
    default before issue 45. Platform events are held to NotBefore, User events approved
    at once, a scale-in Terminate drained. docs/policy.md gives it as POLICY__RULES.

    Terminate comes first because a scale-in Terminate has `EventSource: User`: under
    "approve User events" it would be approved at once and the instance deleted undrained.
    """
    return (
        Rule(
            name="terminate-drain",
            match=Match(event_types=(TERMINATE,)),
            action="drain",
            severity="warning",
        ),
        Rule(
            name="user-initiated",
            match=Match(sources=(USER,)),
            action="approve",
            severity="info",
            ignore_windows=True,
        ),
        Rule(
            name="short-freeze",
            match=Match(event_types=(FREEZE,), duration_at_least=0, duration_below=9),
            action="approve",
            severity="info",
            ignore_windows=True,
        ),
        Rule(name="default-hold", action="hold", severity="warning"),
    )


class PagingPolicy(BaseModel):
    """When an announcement should page (PagerDuty trigger); see the README table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_types: tuple[str, ...] = (PREEMPT, REDEPLOY)
    held_outside_window: tuple[str, ...] = (REBOOT,)
    transitions: tuple[Transition, ...] = (
        Transition.APPROVAL_FAILED,
        Transition.RELAY_SILENT,
        Transition.DRAIN_FAILED,
        Transition.POLICY_INVALID,
        Transition.UNDRAIN_FAILED,
    )

    @field_validator("event_types", "held_outside_window")
    @classmethod
    def _event_types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(closed_set(value, EVENT_TYPES, "an event type") or ())


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: tuple[Rule, ...] = Field(default_factory=default_rules, min_length=1)
    dry_run: bool = False
    windows: tuple[Window, ...] = ()
    timezone: str = "UTC"
    max_concurrent_per_set: int = Field(default=1, ge=1)
    page: PagingPolicy = PagingPolicy()
    # Disruption budgets (functions.model.budgets); max_concurrent_per_set is the default
    # one over sets, always in force beside these.
    budgets: tuple[Budget, ...] = ()

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown IANA time zone {value!r}") from None
        return value

    @field_validator("rules")
    @classmethod
    def _unique_names(cls, rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
        names = [r.name for r in rules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"rule names must be unique; repeated: {dupes}")
        return rules

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def in_window(self, moment: datetime) -> bool:
        if not self.windows:
            return False
        return any(
            opens <= moment < closes
            for window in self.windows
            for opens, closes in window.openings(moment, self.zone)
        )

    def next_window_opening(self, moment: datetime) -> datetime | None:
        """`moment` if inside a window, else the next opening (within a week), else None."""
        if self.in_window(moment):
            return moment
        future = [
            opens
            for window in self.windows
            for opens, _ in window.openings(moment, self.zone)
            if opens > moment
        ]
        return min(future) if future else None


class PolicySettings(BaseSettings):
    """The policy as app settings: `POLICY__RULES` (JSON), `POLICY__DRY_RUN`, ...

    Kept apart from the other settings on purpose: an invalid policy must not stop the
    function app (it fails closed and says so), while a missing connection must.
    """

    model_config = SettingsConfigDict(
        env_prefix="POLICY__", env_nested_delimiter="__", extra="forbid", case_sensitive=False
    )

    rules: tuple[Rule, ...] = Field(default_factory=default_rules)
    dry_run: bool = False
    windows: tuple[Window, ...] = ()
    timezone: str = "UTC"
    max_concurrent_per_set: int = 1
    page: PagingPolicy = PagingPolicy()
    budgets: tuple[Budget, ...] = ()

    @field_validator("rules", mode="before")
    @classmethod
    def _empty_is_reference(cls, value: object) -> object:
        """`POLICY__RULES=[]` is the default policy, as an empty `policyRules` in the
        Bicep is (which leaves the setting out): "no rules of my own", never "no policy"."""
        return default_rules() if value == [] or value == () else value


class PolicyLoad(BaseModel):
    """The effective policy, or why there is none (then everything fails closed)."""

    model_config = ConfigDict(frozen=True)

    policy: Policy | None
    error: str | None = None
    # `error` piece by piece (each names its setting), for `settings check` to list.
    problems: tuple[str, ...] = ()
    # What the policy says that is probably not what was meant but is safe to run (a rule
    # no event reaches, a drain with nothing configured to drain): logged at start,
    # printed by `policy check`, errors under `settings check --strict`.
    warnings: tuple[str, ...] = ()


# Names starting with this are the policy's: one underscore short (POLICY_DRY_RUN) is
# still a policy setting somebody meant.
POLICY_FAMILY = "POLICY_"


def policy_setting_names() -> set[str]:
    return env_names(PolicySettings)


def unknown_policy_names(environ: Iterable[str] | None = None) -> list[str]:
    """An error for each `POLICY_*` name no field reads (POLICY__DRYRUN, POLICY_DRY_RUN)."""
    known = policy_setting_names()
    folded = {k.casefold() for k in known}
    names = os.environ if environ is None else environ
    return [
        f"{name} is not a policy setting{suggestion(name, known)}"
        for name in sorted(names)
        if name.upper().startswith(POLICY_FAMILY) and name.casefold() not in folded
    ]


def load_policy() -> PolicyLoad:
    """Read the policy from `POLICY__*` environment variables; never raises on a bad policy.

    Refused (`error`, the app fails closed): a `POLICY_*` name no field reads, a value the
    models refuse, a rule ordering that lets a less careful rule take events a later rule
    drains or holds (policy_lint). Reported only (`warnings`): dead rules."""
    unknown = unknown_policy_names()
    try:
        settings = PolicySettings()
        policy = Policy.model_validate(settings.model_dump())
    except ValidationError as exc:
        named = {u.split(" ", 1)[0] for u in unknown}  # said once, with its did-you-mean
        problems = [p for p in policy_problems(exc) if p.split(":", 1)[0] not in named]
        return refused([*unknown, *problems])
    except (SettingsError, ValueError) as exc:
        return refused([*unknown, _json_culprit() or str(exc)])
    errors, warnings = lint_rules(policy.rules)
    budget_errors, budget_warnings = lint_budgets(policy.budgets)
    if unknown or errors or budget_errors:
        return refused(
            [
                *unknown,
                *(f"POLICY__RULES: {e}" for e in errors),
                *(f"POLICY__BUDGETS: {e}" for e in budget_errors),
            ]
        )
    notes = [f"POLICY__RULES: {w}" for w in warnings]
    notes += [f"POLICY__BUDGETS: {w}" for w in budget_warnings]
    clash = per_set_notes(policy.budgets, policy.max_concurrent_per_set)
    notes += [f"POLICY__BUDGETS: {w}" for w in clash]
    if _empty_rules_setting():
        notes.append(
            "POLICY__RULES: an empty list: the default policy (drain, then approve) applies "
            "(as without the setting); remove it, or list your rules"
        )
    return PolicyLoad(policy=policy, warnings=tuple(notes))


def _empty_rules_setting() -> bool:
    """POLICY__RULES is set to an empty JSON list (any case of the name)."""
    for key, value in os.environ.items():
        if key.upper() == "POLICY__RULES":
            try:
                return bool(json.loads(value) == [])
            except json.JSONDecodeError:
                return False
    return False


def refused(problems: list[str]) -> PolicyLoad:
    """No policy to act on (fail closed), because of `problems`."""
    return PolicyLoad(policy=None, error="; ".join(problems), problems=tuple(problems))


def policy_problems(exc: ValidationError) -> list[str]:
    """Each error named by its app setting: `POLICY__PAGE__EVENT_TYPES: ...`,
    `POLICY__RULES[2].match.sources: ...`."""
    nested = {name for name, info in PolicySettings.model_fields.items() if _is_model(info)}
    parts = []
    for error in exc.errors(include_url=False):
        loc = [str(p) for p in error["loc"]]
        if not loc:
            parts.append(f"POLICY: {error['msg']}")
            continue
        head = f"POLICY__{loc[0].upper()}"
        rest = loc[1:]
        if loc[0] in nested and rest and not rest[0].isdigit():
            head, rest = f"{head}__{rest[0].upper()}", rest[1:]
        path = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in rest)
        message = error_message(error)
        if error["type"] == "extra_forbidden" and rest:
            message = f"{rest[-1]!r} is not a field{_quoted(suggestion(rest[-1], _fields()))}"
        parts.append(f"{head}{path}: {message}")
    return parts


def _fields() -> set[str]:
    """Every field name a policy value may use (for "did you mean" on a misspelt one)."""
    models = (Rule, Match, Window, PagingPolicy, Policy, Budget)
    return {f for m in models for f in m.model_fields}


def _is_model(info: Any) -> bool:
    return isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)


def _json_culprit() -> str | None:
    """pydantic-settings says only "error parsing value"; name the setting and the JSON error."""
    for key, value in os.environ.items():
        if not key.upper().startswith("POLICY__") or value.strip()[:1] not in "[{":
            continue
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            return f"{key.upper()} is not valid JSON: {exc.msg} at character {exc.pos}"
    return None


def summarize(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "policy"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def fail_closed(error: str) -> Decision:
    return Decision(
        action="hold",
        rule="policy-invalid",
        reason=f"the policy or a setting did not validate, so nothing is approved: {error}",
        severity="error",
        page=True,
        policy_error=error,
    )


def decide(
    load: PolicyLoad | Policy,
    event: ScheduledEvent,
    now: datetime,
    scale_sets: tuple[str, ...] = (),
    tags: Mapping[str, str] | None = None,
    drain: DrainKind | None = None,
) -> Decision:
    """The policy's decision for one event at time `now` (before the capacity guard).

    `scale_sets` and `tags` are Azure's facts about the VM (the identity sync's), which
    rules match as budgets do; unknown tags (None) never match a `tags` criterion.
    `drain` is the drain the VM really has (functions.model.drains.drain_for's kind; None:
    not known here, the drain workflow finds out): with "none", a `drain` decision
    becomes Microsoft's sample (`no_drain`)."""
    if isinstance(load, PolicyLoad):
        if load.policy is None:
            return fail_closed(load.error or "unknown error")
        policy = load.policy
    else:
        policy = load
    rule = next((r for r in policy.rules if r.match.matches(event, scale_sets, tags)), None)
    if rule is None:
        return Decision(
            action="hold",
            rule="no-rule-matched",
            reason="no rule matched; holding until NotBefore",
            page=_default_page(policy, event, "hold", now),
            dry_run=policy.dry_run,
        )
    action = rule.action
    reason = f"rule {rule.name!r}: {action}"
    approve_after = None
    if action == "approve" and policy.windows and not rule.ignore_windows and event.is_scheduled:
        opening = policy.next_window_opening(now)
        if opening is None or opening > now:
            not_before = event.not_before
            if opening is not None and (not_before is None or opening < not_before):
                approve_after = opening
                reason = f"rule {rule.name!r}: approve when the maintenance window opens"
            else:
                action = "hold"
                reason = (
                    f"rule {rule.name!r}: approve, but no maintenance window opens before "
                    "NotBefore; it starts at NotBefore"
                )
    if action == "drain" and drain == NO_DRAIN_KIND:
        action, reason = no_drain(rule.name, event)
    page = rule.page if rule.page is not None else _default_page(policy, event, action, now)
    return Decision(
        action=action,
        rule=rule.name,
        reason=reason,
        channels=rule.channels,
        severity=rule.severity,
        page=page,
        approve_after=approve_after,
        dry_run=policy.dry_run,
    )


# A view decided while the policy was invalid keeps its VM's tags whole when they are this
# small (JSON characters), so the re-decision once the policy is valid can match them;
# larger tag sets are not known to the re-decision (a `tags` criterion then never matches).
TAGS_KEPT_WHOLE = 1024


def rule_tags(load: PolicyLoad | Policy, tags: Mapping[str, str] | None) -> dict[str, str] | None:
    """The part of a VM's Azure tags a decision under `load` can depend on, to keep beside
    it for a later re-decision: the tags the rules name (case-insensitively). Under an
    invalid policy, which tags matter is not known: all of them if small, else None."""
    if tags is None:
        return None
    policy = load.policy if isinstance(load, PolicyLoad) else load
    if policy is None:
        whole = dict(tags)
        return whole if len(json.dumps(whole)) <= TAGS_KEPT_WHOLE else None
    named = {n.casefold() for r in policy.rules if r.match.tags for n in r.match.tags}
    return {k: v for k, v in tags.items() if k.casefold() in named}


def no_drain(rule: str, event: ScheduledEvent) -> tuple[Action, str]:
    """A `drain` on a VM with no working drain (no hook, no HTTP drain, no load balancer
    probing its readiness): Microsoft's sample. A Platform event is held to NotBefore
    (Azure's maintenance waits as long as it may), a User Reboot or Redeploy is approved
    at once (its owner asked for it). A scale-in Terminate is held too: deleting an
    undrained instance at once would cut off the in-flight work its notice gives time to
    finish (issue 33). Each says so: a card reading "no drain on this VM" is the
    operator's cue to give the VM one."""
    if _in(event.event_source, (USER,)) and not _in(event.event_type, (TERMINATE,)):
        return "approve", f"rule {rule!r}: {NO_DRAIN_TEXT}: approved at once (a User event)"
    return "hold", f"rule {rule!r}: {NO_DRAIN_TEXT}: held until NotBefore"


def _default_page(policy: Policy, event: ScheduledEvent, action: str, now: datetime) -> bool:
    if _in(event.event_type, policy.page.event_types):
        return True
    if action == "hold" and _in(event.event_type, policy.page.held_outside_window):
        moment = event.not_before or now
        return not policy.in_window(moment)
    return False


def transition_pages(policy: Policy | None, transition: Transition) -> bool:
    if policy is None:
        return transition in PagingPolicy().transitions
    return transition in policy.page.transitions


def effective_policy_json(load: PolicyLoad) -> str:
    assert load.policy is not None
    return load.policy.model_dump_json(indent=2)
