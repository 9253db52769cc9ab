"""tests/needs.py: a missing privilege or tool skips outside CI and fails under CI=true."""

from __future__ import annotations

import pytest

from tests.needs import missing


def test_outside_ci_a_missing_tool_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="unshare"):
        missing("needs unshare")


def test_under_ci_a_missing_tool_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: this test must run"):
        missing("needs unshare")
