"""host.json's time limits and the longest drain a scale set allows agree (and the README
says so): a drain may use the whole notice, and must never be cut off by the host."""

from __future__ import annotations

import json
import re

from tests.infra.bicep import ROOT, iso_minutes, load


def _minutes(text: str) -> float:
    hours, minutes, seconds = (float(p) for p in text.split(":"))
    return hours * 60 + minutes + seconds / 60


def _longest_notice() -> float:
    main = load("main")
    allowed = main.decorator("terminateNotBeforeTimeout", "allowed")
    return max(iso_minutes(value) for value in allowed)


def test_function_timeout_outlasts_the_longest_notice() -> None:
    host = json.loads((ROOT / "host.json").read_text())
    timeout = _minutes(host["functionTimeout"])
    lock = _minutes(host["extensions"]["serviceBus"]["maxAutoLockRenewalDuration"])
    longest = _longest_notice()
    assert longest == 15
    assert timeout > longest, "a drain using the whole notice would be cut off"
    assert lock >= timeout, "the terminate message's lock would lapse mid-drain"
    readme = (ROOT / "functions" / "README.md").read_text()
    said = re.search(r"`functionTimeout` to (\d+) minutes", readme)
    assert said and float(said[1]) == timeout
    assert f"(`PT{int(longest)}M`)" in readme
