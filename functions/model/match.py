"""What a rule or a budget applies to: Azure's closed sets, and the `match` criteria.

Kept apart from functions.model.policy so that budgets (functions.model.budgets) and rules
share one `Match`, and the policy module stays about the policy.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from functions.model.envelope import (
    FREEZE,
    PLATFORM,
    PREEMPT,
    REBOOT,
    REDEPLOY,
    SCHEDULED,
    STARTED,
    TERMINATE,
    USER,
    ScheduledEvent,
)
from functions.setting_names import suggestion

# Azure's tag limits (MicrosoftDocs/azure-docs articles/azure-resource-manager/management/
# tag-resources.md @ 000024f4, "Limitations"): at most 50 tags, a name at most 512
# characters and without < > % & \ ? /, a value at most 256. Names compare
# case-insensitively, values case-sensitively (same page: "Tag names are case-insensitive
# for operations ... Tag values are case-sensitive").
MAX_TAGS = 50
MAX_TAG_NAME = 512
MAX_TAG_VALUE = 256
TAG_NAME_FORBIDDEN = frozenset("<>%&\\?/")

# Azure's closed sets (Scheduled Events and its Event Grid events): a value outside them
# can never match, so it is a typo and refused. Completed and Canceled come only from Event
# Grid, and an ended event is never decided (policy_lint reports a rule needing them).
EVENT_TYPES: tuple[str, ...] = (FREEZE, REBOOT, REDEPLOY, PREEMPT, TERMINATE)
SOURCES: tuple[str, ...] = (PLATFORM, USER)
STATUSES: tuple[str, ...] = (SCHEDULED, STARTED, "Completed", "Canceled")


def closed_set(
    values: tuple[str, ...] | None, allowed: tuple[str, ...], what: str
) -> tuple[str, ...] | None:
    """`values` if each is one of `allowed` (case-insensitively, as Azure compares);
    otherwise a ValueError naming each stranger and the closest allowed value."""
    if values is None:
        return values
    folded = {a.casefold() for a in allowed}
    bad = [
        f"{v!r} is not {what}{quoted(suggestion(v, allowed, cutoff=0.6))}"
        for v in values
        if v.casefold() not in folded
    ]
    if bad:
        raise ValueError(f"{'; '.join(bad)} (Azure's: {', '.join(allowed)})")
    return values


def quoted(hint: str) -> str:
    return hint.replace("did you mean ", "did you mean '").replace("?", "'?") if hint else ""


def check_tag_name(name: str) -> str:
    """An Azure tag name, or a ValueError saying why it can never be one."""
    if not name or len(name) > MAX_TAG_NAME:
        raise ValueError(f"a tag name is 1 to {MAX_TAG_NAME} characters, not {len(name)}")
    bad = sorted(set(name) & TAG_NAME_FORBIDDEN)
    if bad:
        raise ValueError(f"tag name {name[:80]!r} holds {' '.join(bad)}: Azure tag names never do")
    return name


class Match(BaseModel):
    """What a rule (or a budget) applies to. Every given criterion must hold; an empty
    match matches all.

    Names compare case-insensitively (Azure does). `duration_at_least` is inclusive and
    `duration_below` exclusive, so Microsoft's "0 <= DurationInSeconds < 9" is
    `{"duration_at_least": 0, "duration_below": 9}`; an event without a duration (older API
    versions) never matches a rule that has a duration criterion. `tags` (budgets only, see
    functions.model.budgets) maps Azure tag names to globs over the VM's tag value, as
    Resource Graph reports it: `{"service": "checkout"}`, `{"tier": ["web", "api-*"]}`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_types: tuple[str, ...] | None = None
    sources: tuple[str, ...] | None = None
    statuses: tuple[str, ...] | None = None
    # IMDS sends -1 for "unknown": a negative bound would match unknown durations.
    duration_at_least: int | None = Field(default=None, ge=0)
    duration_below: int | None = Field(default=None, ge=0)
    resources: tuple[str, ...] | None = None  # globs over VM names, any named VM matches
    # Globs over the scale set names of the named VMs, as `resources` over VM names: an
    # AKS node pool's set is `aks-<pool>-<number>-vmss`, so `aks-*` is what one writes.
    scale_sets: tuple[str, ...] | None = None
    tags: dict[str, tuple[str, ...]] | None = None

    @field_validator("event_types")
    @classmethod
    def _event_types(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return closed_set(value, EVENT_TYPES, "an event type")

    @field_validator("sources")
    @classmethod
    def _sources(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return closed_set(value, SOURCES, "an event source")

    @field_validator("statuses")
    @classmethod
    def _statuses(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return closed_set(value, STATUSES, "an event status")

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, value: object) -> object:
        """One glob or a list of them per tag name; names as Azure allows them."""
        if value is None or not isinstance(value, Mapping):
            return value
        if len(value) > MAX_TAGS:
            raise ValueError(f"at most {MAX_TAGS} tags (Azure's limit per resource)")
        out: dict[str, object] = {}
        for name, globs in value.items():
            check_tag_name(str(name))
            items = [globs] if isinstance(globs, str) else globs
            if isinstance(items, list | tuple) and not items:
                raise ValueError(f"tag {name!r}: an empty list matches no VM")
            out[str(name)] = items
        folded = [n.casefold() for n in out]
        if len(set(folded)) != len(folded):
            raise ValueError("a tag name is given twice (tag names are case-insensitive)")
        return out

    @model_validator(mode="after")
    def _range(self) -> Match:
        low, high = self.duration_at_least, self.duration_below
        if low is not None and high is not None and high <= low:
            raise ValueError(f"duration_below ({high}) must be above duration_at_least ({low})")
        return self

    def matches(
        self,
        event: ScheduledEvent,
        scale_sets: tuple[str, ...] = (),
        tags: Mapping[str, str] | None = None,
    ) -> bool:
        """Whether `event` (for VMs in `scale_sets`, tagged `tags`) matches. A `tags`
        criterion against unknown tags (None) never matches."""
        if not self.matches_event(event):
            return False
        return self.matches_vm(event.resources, scale_sets, tags)

    def matches_event(self, event: ScheduledEvent) -> bool:
        """The criteria about the event itself: type, source, status, duration."""
        if self.event_types is not None and not _in(event.event_type, self.event_types):
            return False
        if self.sources is not None and not _in(event.event_source, self.sources):
            return False
        if self.statuses is not None and not _in(event.event_status, self.statuses):
            return False
        duration = event.duration_in_seconds
        if self.duration_at_least is not None and (
            duration is None or duration < self.duration_at_least
        ):
            return False
        return not (
            self.duration_below is not None
            and (duration is None or duration >= self.duration_below)
        )

    def matches_vm(
        self,
        names: Iterable[str],
        scale_sets: Iterable[str] = (),
        tags: Mapping[str, str] | None = None,
    ) -> bool:
        """The criteria about the VMs: names, scale sets, tags (Azure's facts)."""
        if self.resources is not None and not _glob_any(names, self.resources):
            return False
        if self.scale_sets is not None and not _glob_any(scale_sets, self.scale_sets):
            return False
        return self.tags is None or (tags is not None and tags_match(self.tags, tags))


def tags_match(wanted: Mapping[str, tuple[str, ...]], tags: Mapping[str, str]) -> bool:
    """Every wanted tag is on the VM (name case-insensitively) with a value some glob
    matches (case-sensitively, as Azure compares tag values)."""
    folded = {k.casefold(): v for k, v in tags.items()}
    for name, globs in wanted.items():
        value = folded.get(name.casefold())
        if value is None or not any(fnmatch.fnmatchcase(value, g) for g in globs):
            return False
    return True


def _glob_any(names: Iterable[str], patterns: tuple[str, ...]) -> bool:
    """Some name matches some glob, case-insensitively (Azure's names are)."""
    return any(
        fnmatch.fnmatchcase(name.casefold(), pattern.casefold())
        for name in names
        for pattern in patterns
    )


def _in(value: str | None, options: tuple[str, ...]) -> bool:
    return value is not None and value.casefold() in {o.casefold() for o in options}


IMPACT_FREE_BELOW_SECONDS = 9


def is_impactful(event: ScheduledEvent) -> bool:
    """Whether approving takes the VM away: all but short Freezes (the seed's "< 9 s" class).

    The capacity guard counts only impactful events, so a burst of memory-preserving
    pauses never blocks a reboot, nor the other way round.
    """
    if event.event_type.casefold() != FREEZE.casefold():
        return True
    duration = event.duration_in_seconds
    return duration is None or not (0 <= duration < IMPACT_FREE_BELOW_SECONDS)
