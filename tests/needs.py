"""What a test cannot run without, said the same way everywhere.

Outside CI a missing tool or privilege skips the test with the reason (a developer's laptop
without root still runs the rest). Under CI=true it fails: a CI container without root,
`unshare -m` or systemd's tools would otherwise skip whole modules and stay green while
testing nothing of them (issue 47: 13 tests of test_enrolment.py and test_hook_unit.py)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def missing(why: str) -> NoReturn:
    """Skip (outside CI) or fail (CI=true) the running test, saying what is missing."""
    if in_ci():
        pytest.fail(f"{why} (CI=true: this test must run, not skip)")
    pytest.skip(why)
