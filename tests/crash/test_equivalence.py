"""The explorer's shortcut (one run per group of equivalent crash points, `equivalence`)
against running every point (`--exhaustive`), on a small scenario (issue 47: until now
checked once, by hand).

Both ways must find the same divergent points. With the code as it is, no point diverges,
and "both find none" would hold for any grouping; so the audit is broken on purpose
(written before the write it records instead of in its transaction, and without its `once`
key: a retried approval audits twice), which makes the points between the audit and the
row's write diverge, and only those. Then a grouping that
merges points which are not equivalent (the negative control) misses some of them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from functions.model.policy import Policy
from functions.store.events import EventRows
from functions.store.rows import UNREAD
from tests.crash import explore as explorer
from tests.crash.explore import explore
from tests.crash.faults import Fault, Sent
from tests.crash.runner import Step, drain, settle
from tests.crash.scenario_steps import approve_rule, doc
from tests.crash.scenarios import Scenario
from tests.crash.world import Config, Servers
from tests.functions.conftest import event

pytestmark = [pytest.mark.azurite, pytest.mark.slow]


def one_approval(servers: Servers) -> tuple[Config, list[Step]]:
    """A Reboot of one VM approved by policy through its relay at its first report."""
    ev = event("EV-EQ", "Reboot", resources=("eq1",))
    steps = [doc("eq1", 1, [ev], servers, 0), drain(), *settle(120.0)]
    return Config(policy=Policy(rules=(approve_rule("Reboot"),))), steps


SMALL = Scenario("one-approval", "a Reboot approved at once", one_approval)


def divergent(report: Any) -> dict[Fault, bool]:
    return {p.fault: bool(p.difference) for p in report.points}


@pytest.fixture
def audit_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit rows written apart from the write they record (before it, as before
    issue 47) and without their `once` key: a retry after a crash between the two audits
    again."""
    real = EventRows.mutate_event

    def mutate(
        self: Any, event_id: str, change: Any, known: Any = UNREAD, with_rows: Any = None
    ) -> Any:
        for row in with_rows or []:
            self.events.upsert_entity({**row, "RowKey": f"{row['RowKey']}-{uuid.uuid4().hex}"})
        return real(self, event_id, change, known=known)

    monkeypatch.setattr(EventRows, "mutate_event", mutate)


@pytest.mark.timeout(600)
def test_the_shortcut_finds_what_every_point_finds(azurite: str, audit_twice: None) -> None:
    shortcut = explore(azurite, SMALL)
    every = explore(azurite, SMALL, exhaustive=True)
    assert shortcut.tried() == every.tried() == 2 * every.requests
    assert every.runs == every.tried() and shortcut.runs < every.runs
    found = divergent(every)
    assert any(found.values()) and not all(found.values()), every.table()
    assert divergent(shortcut) == found, (shortcut.table(), every.table())

    # The negative control: one group per step, whatever changed in between.
    def per_step(sent: list[Sent]) -> dict[Any, list[Fault]]:
        groups: dict[Any, list[Fault]] = {}
        for s in sorted(sent, key=lambda s: s.index):
            groups.setdefault(s.step, []).extend([Fault(s.index, "before"), Fault(s.index, "lost")])
        return groups

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(explorer, "equivalence", per_step)
        broken = explore(azurite, SMALL)
    assert divergent(broken) != found, broken.table()


@pytest.mark.timeout(600)
def test_forked_runs_find_what_fresh_runs_find(azurite: str, audit_twice: None) -> None:
    """The runs forked from a replay (tests.crash.checkpoint) against the same runs made
    from the start each (issue 47's make-room): the same points diverge, each the same
    way, and the same invariants break."""
    forked = explore(azurite, SMALL, fork=True)
    fresh = explore(azurite, SMALL, fork=False)
    assert forked.forked and not fresh.forked
    assert forked.runs == fresh.runs and forked.tried() == fresh.tried()
    found = {p.fault: p.difference for p in fresh.points}
    assert any(found.values()) and not all(found.values()), fresh.table()
    assert {p.fault: p.difference for p in forked.points} == found, (forked.table(), fresh.table())
    assert forked.violations() == fresh.violations()


def test_a_forked_run_that_does_not_start_where_its_point_is_fails_loudly(
    azurite: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: with Azurite's tables not put back after each forked run, the next
    run starts on the last one's writes, and the replay ends elsewhere than the fault-free
    run; that is an error, never a result."""
    from tests.crash import checkpoint

    real = checkpoint.Checkpoints.call

    def no_restore(self: Any, what: str, prefix: str) -> None:
        if what != "restore":
            real(self, what, prefix)

    monkeypatch.setattr(checkpoint.Checkpoints, "call", no_restore)
    with pytest.raises(checkpoint.CheckpointError):
        explore(azurite, SMALL, fork=True)
