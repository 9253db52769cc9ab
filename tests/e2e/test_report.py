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


def test_the_report_draws_a_lane_per_event_and_shows_each_payload():
    from datetime import UTC, datetime, timedelta

    from functions.web.timeline import Lane, Mark
    from local.report import EventRow, Payload, ReportData

    t0 = datetime(2026, 11, 21, 10, tzinfo=UTC)
    data = ReportData(
        lanes=[
            Lane(
                "EV-1",
                "Reboot web-1, web-2",
                (
                    Mark(t0, "scheduled"),
                    Mark(t0 + timedelta(seconds=15), "not_before"),
                    Mark(t0 + timedelta(seconds=1), "decided", "decided hold <b>"),
                    Mark(t0 + timedelta(seconds=16), "started"),
                    Mark(t0 + timedelta(seconds=26), "removed"),
                ),
            ),
            Lane("EV-2", "Freeze web-1", (Mark(t0, "scheduled"), Mark(t0, "approved"))),
        ],
        events=[EventRow("EV-1", "Reboot", "web-1, web-2", "", "HOLD", "not approved", "teams")],
        policy_source="the default",
        policy='{"rules": []}',
        payloads=[Payload("teams", "EV-1", "Teams card", t0, 202, '{"type": "<message>"}')],
    )
    page = render_html("Demo", [], [Outcome("a", True)], data=data)
    assert page.count('<g class="lane"') == 2
    assert "mark-not_before" in page and "mark-approved" in page
    assert "decided hold &lt;b&gt;" in page and "<b>" not in page
    assert '<details class="payload payload-teams">' in page
    assert "&lt;message&gt;" in page and "Policy in effect" in page
