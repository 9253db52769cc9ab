"""Print what the offline schema check covered at the end of a run that included it."""

from __future__ import annotations

SUMMARIES: list[str] = []


def pytest_terminal_summary(terminalreporter) -> None:
    for line in SUMMARIES:
        terminalreporter.write_line(line)
