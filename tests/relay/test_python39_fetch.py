"""The bullseye fetch falls back to Debian's archive once the mirrors drop bullseye.

Bullseye's support ended on 2026-08-31; when it leaves deb.debian.org, `make test` under
CI=true would fail in the relay's Python 3.9 step. Here the mirror is made to fail as it
will (apt-get exits non-zero) and the fetch must go on to archive.debian.org with the
expired-Release check relaxed, without touching the network."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.relay import python39


def _apt_that_refuses(refused: str, calls: list[tuple[str, tuple[str, ...]]], listing: Path):
    def run(*args: str) -> None:
        text = listing.read_text()
        calls.append((text, args))
        if refused in text:
            raise subprocess.CalledProcessError(100, ["apt-get", *args])

    return run


def test_a_mirror_without_bullseye_falls_back_to_the_archive(tmp_path: Path) -> None:
    listing = tmp_path / "sources.list"
    calls: list[tuple[str, tuple[str, ...]]] = []
    where = python39.candidates("http://deb.debian.org/debian", "")
    used = python39.download(where, _apt_that_refuses("deb.debian.org", calls, listing), listing)
    assert used == python39.ARCHIVE
    archive_calls = [args for text, args in calls if "archive.debian.org" in text]
    assert archive_calls[0][-1] == "update"
    # The archive's Release files are expired by design: apt must be told to accept them.
    assert all("-oAcquire::Check-Valid-Until=false" in args for args in archive_calls)
    assert any("download" in args and "python3.9-minimal" in args for args in archive_calls)
    text = listing.read_text()
    assert "archive.debian.org/debian bullseye main" in text
    assert "archive.debian.org/debian-security bullseye-security main" in text


def test_the_mirror_is_tried_first_and_kept_when_it_works(tmp_path: Path) -> None:
    listing = tmp_path / "sources.list"
    calls: list[tuple[str, tuple[str, ...]]] = []
    where = python39.candidates("http://deb.debian.org/debian", "")
    used = python39.download(where, _apt_that_refuses("never", calls, listing), listing)
    assert used == "http://deb.debian.org/debian"
    assert all("archive.debian.org" not in text for text, _ in calls)
    assert all("-oAcquire::Check-Valid-Until=false" not in args for _, args in calls)


def test_nowhere_serving_bullseye_fails_under_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    listing = tmp_path / "sources.list"
    where = python39.candidates("http://deb.debian.org/debian", "")
    with pytest.raises(SystemExit, match="CI=true"):
        python39.download(where, _apt_that_refuses("bullseye", [], listing), listing)
