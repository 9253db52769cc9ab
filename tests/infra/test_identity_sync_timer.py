"""The bulk identity sync's timer as the host indexes it, and its time limits: runs never
overlap, never outlive the host's function timeout, and a pass comes round before the
facts it wrote are stale."""

from __future__ import annotations

import json

from functions.settings import Settings
from functions.triggers.identity import SCHEDULE
from tests.infra.bicep import ROOT
from tests.infra.test_host_indexing import indexed


def _every_minutes(ncrontab: str) -> int:
    second, minute, *rest = ncrontab.split()
    assert second == "0" and rest == ["*", "*", "*", "*"], ncrontab
    assert minute.startswith("*/"), ncrontab
    return int(minute[2:])


def test_the_host_indexes_the_sync_timer() -> None:
    (trigger,) = [b for b in indexed()["identity_sync"] if b["type"] == "timerTrigger"]
    assert trigger["schedule"] == SCHEDULE
    assert not trigger.get("runOnStartup", False)  # a restart wave must not start passes


def test_a_run_ends_before_the_next_and_within_the_function_timeout() -> None:
    interval = _every_minutes(SCHEDULE) * 60
    budget_field = Settings.model_fields["resource_graph_sync_budget_seconds"]
    most = max(m.le for m in budget_field.metadata if getattr(m, "le", None) is not None)
    assert most < interval
    host = json.loads((ROOT / "host.json").read_text())
    h, m, s = (int(x) for x in host["functionTimeout"].split(":"))
    assert most < h * 3600 + m * 60 + s


def test_a_pass_comes_round_before_its_facts_are_stale() -> None:
    settings = Settings()
    assert settings.resource_graph_sync_hours * 3600 < settings.vm_facts_max_age_seconds
