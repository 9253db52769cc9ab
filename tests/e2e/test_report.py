"""The timeline and the HTML report tell the same story, and nothing in it can break the page."""

from __future__ import annotations

import io

from local.report import Outcome, Timeline, render_html, summary_lines, write_html


def test_timeline_lines_and_report_share_the_entries(tmp_path):
    out = io.StringIO()
    timeline = Timeline(stream=out, colour=False)
    timeline.add("imds", "ABCD1234", "Reboot Scheduled for <web-1>")
    timeline.add("check", "demo", "approved", ok=False)
    lines = out.getvalue().splitlines()
    assert "IMDS" in lines[0] and "Reboot Scheduled for <web-1>" in lines[0]
    assert "✘ approved" in lines[1]
    outcomes = [
        Outcome("platform reboot held", True, "no StartRequests"),
        Outcome("preempt paged", False, "0 triggers"),
        Outcome("teams", False, "real endpoint", skipped=True),
    ]
    page = write_html(
        tmp_path / "out" / "r.html", "Demo", timeline.snapshot(), outcomes, {"x": "y"}
    )
    html = page.read_text()
    assert "&lt;web-1&gt;" in html and "<web-1>" not in html
    assert html.count('class="fail"') == 2  # the failed outcome and the failed entry
    assert "NOT met" in html and "skipped" in html
    assert render_html("t", [], []).startswith("<!doctype html>")


def test_summary_counts_unchecked_outcomes_apart():
    lines = summary_lines(
        [Outcome("a", True), Outcome("b", False), Outcome("c", False, skipped=True)]
    )
    assert lines[-1] == "  1/2 expected outcomes met, 1 not checked; 1 NOT met"
    assert lines[1].startswith("  [FAIL] b")


def test_a_closed_pipe_stops_printing_but_not_recording():
    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError

    timeline = Timeline(stream=ClosedPipe(), colour=False)
    timeline.add("demo", "demo", "one")
    timeline.add("demo", "demo", "two")
    assert timeline.stream is None
    assert [e.text for e in timeline.snapshot()] == ["one", "two"]
