"""The timeline and the HTML report tell the same story, and nothing in it can break the page."""

from __future__ import annotations

import io
from types import SimpleNamespace

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
    # The failed outcome (under "Needs attention" and in the checklist) and the entry.
    assert html.count('class="fail"') == 3
    assert "NOT met" in html and "skipped" in html
    assert render_html("t", [], []).startswith("<!doctype html>")


def test_summary_counts_unchecked_outcomes_apart():
    lines = summary_lines(
        [Outcome("a", True), Outcome("b", False), Outcome("c", False, skipped=True)]
    )
    assert lines[-1] == "  1/2 expected outcomes met, 1 not checked; 1 NOT met"
    assert lines[0].startswith("  [FAIL] b")  # not met first (issue 38)


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


def _track(**extra):
    from datetime import UTC, datetime, timedelta

    from local.watcher import EventTrack

    t0 = datetime(2026, 11, 21, 10, tzinfo=UTC)
    fields = dict(
        event_id="EV-1",
        event_type="Reboot",
        source="Platform",
        duration=-1,
        resources=("web-1",),
        description=None,
        first_seen=0.0,
        first_seen_wall=t0,
        first_status="Scheduled",
        not_before=t0 + timedelta(seconds=15),
    )
    fields.update(extra)
    return EventTrack(**fields)


def _note(transition: str, seconds: float, action: str = "hold", detail: str = ""):
    from datetime import UTC, datetime, timedelta

    from functions.model.event import Decision, Notification, Transition

    return Notification(
        transition=Transition(transition),
        occurred_at=datetime(2026, 11, 21, 10, tzinfo=UTC) + timedelta(seconds=seconds),
        decision=Decision(action=action, rule=f"rule-{action}"),
        detail=detail,
    )


def _delivery(channel: str, action: str | None = None):
    from types import SimpleNamespace

    return SimpleNamespace(channel=channel, action=action, event_id="EV-1", posted=True)


def test_a_host_failure_is_decided_as_the_app_does_and_had_nothing_to_approve():
    """The app decides and announces an event first seen Started (the reference policy
    holds it, and a held Reboot pages), as the demo's log line says; the report used to
    say "nothing to decide" beside that line (issue 33). Both now say what happens."""
    from local.report_events import event_row

    track = _track(first_status="Started", not_before=None, removed_at=30.0)
    row = event_row(track, [_note("decided", 1)], [], [])
    assert row.decision == (
        "hold by rule rule-hold: already Started when IMDS first showed it (host failure): "
        "nothing to approve"
    )
    assert row.approval == "none needed"
    assert row.final_state == "completed"


def test_the_log_line_of_a_started_event_says_there_is_nothing_to_approve():
    from datetime import UTC, datetime

    from functions.model.event import Decision, EventSnapshot, Notification, Transition
    from local.narration import announcement

    started = EventSnapshot(
        event_id="EV-1", event_type="Reboot", event_status="Started", resources=("w_1",)
    )
    note = Notification(
        transition=Transition.DECIDED,
        occurred_at=datetime(2026, 11, 21, 10, tzinfo=UTC),
        event=started,
        decision=Decision(action="hold", rule="default-hold"),
    )
    _, _, text = announcement(note, [])
    assert text.startswith(
        "decided HOLD by rule default-hold (already Started: nothing to approve)"
    )
    scheduled = note.model_copy(
        update={"event": started.model_copy(update={"event_status": "Scheduled"})}
    )
    assert "already Started" not in announcement(scheduled, [])[2]


def test_the_report_explains_deliveries_beside_payloads():
    """ "147 deliveries" in the checklist beside "Payloads sent (109)": the report says
    what each number counts."""
    from datetime import UTC, datetime

    from local.report import Payload, ReportData, payload_counts, render_html

    t0 = datetime(2026, 11, 21, 10, tzinfo=UTC)
    data = ReportData(
        payloads=[
            Payload("teams", "EV-1", "card", t0, 202, "{}"),
            Payload("drain", "EV-1", "drain request", t0, 200, "{}"),
        ],
        deliveries=9,
        posted=1,
    )
    words = payload_counts(data)
    assert words.startswith("1 channel posts and 1 drain hook requests; 9 deliveries")
    assert "1 of them posted, 8 not sent by their channel" in words
    assert "9 deliveries (each announcement handed to each channel)" in render_html(
        "Demo", [], [], data=data
    )


def test_a_withdrawn_event_reads_cancelled_not_held():
    from local.report_events import event_row

    notes = [_note("decided", 1), _note("cancelled", 9)]
    row = event_row(_track(removed_at=9.0), notes, [], [_delivery("teams")])
    assert row.final_state.startswith("cancelled")
    # without the announcement, the simulator's view says the same
    assert event_row(_track(removed_at=9.0), [], [], []).final_state.startswith("cancelled")
    assert event_row(_track(), [], [], []).final_state == "still scheduled when the demo ended"


def test_pagerduty_resolve_is_news_only_where_it_paged():
    from local.report_events import told_text

    quiet = [_delivery("teams"), _delivery("pagerduty", "resolve"), _delivery("webhook")]
    assert told_text(quiet) == "teams, webhook; never paged"
    paged = [_delivery("pagerduty", "trigger"), _delivery("pagerduty", "resolve")]
    assert told_text(paged) == "PagerDuty resolve, PagerDuty trigger"
    assert told_text([]) == "never paged"


def test_the_drain_shows_when_it_started_and_ended():
    from local.report_events import drain_text, event_row

    notes = [
        _note("decided", 1, "drain"),
        _note("drain_started", 2, "drain"),
        _note("approved", 9.5, "drain", detail="approved via relay"),
    ]
    assert drain_text(notes) == "started 10:00:02, done 10:00:09 (7.5 s)"
    failed = [_note("drain_started", 2, "drain"), _note("drain_failed", 5, "drain", "hook 500")]
    assert drain_text(failed) == "started 10:00:02, FAILED 10:00:05: hook 500"
    assert drain_text([_note("decided", 1)]) == ""
    from datetime import timedelta
    from types import SimpleNamespace

    track = _track(event_type="Terminate", source="User")
    approval = SimpleNamespace(vm="web-1", at=track.not_before - timedelta(seconds=5.5))
    row = event_row(track, notes, [approval], [])
    assert row.approval == "StartRequests from web-1's relay, 5.5 s before NotBefore"
    undrained = [*notes, _note("undrained", 30, "drain")]
    assert drain_text(undrained) == "started 10:00:02, done 10:00:09 (7.5 s); undrained 10:00:30"
    arm = SimpleNamespace(vm="arm:virtualMachines/legacy-1", at=approval.at)
    assert event_row(track, notes, [arm], []).approval == (
        "Resource Manager acknowledged it for legacy-1 (no relay could), 5.5 s before NotBefore"
    )
    assert row.decision == "drain by rule rule-drain"


def test_the_report_leads_with_the_events_and_the_checklist_follows():
    from datetime import UTC, datetime

    from functions.web.timeline import Lane, Mark
    from local.report import EventRow, ReportData

    t0 = datetime(2026, 11, 21, 10, tzinfo=UTC)
    data = ReportData(
        lanes=[Lane("EV-1", "Reboot web-1", (Mark(t0, "scheduled"),))],
        events=[
            EventRow(
                "EV-1",
                "Reboot",
                "web-1",
                "",
                "hold by rule x",
                "not approved",
                "teams",
                final_state="cancelled: Azure withdrew it before it started",
            )
        ],
    )
    page = render_html("Demo", [], [Outcome("a", True)], data=data)
    assert page.index("What happened to each event") < page.index("Expected outcomes")
    assert '<td class="final">cancelled: Azure withdrew it before it started</td>' in page


def test_a_drained_events_lane_shows_the_drain():
    from datetime import UTC, datetime, timedelta

    from functions.web.timeline import Lane, Mark
    from local.report import ReportData
    from local.report_data import DRAIN_MARKS

    t0 = datetime(2026, 11, 21, 10, tzinfo=UTC)
    lane = Lane(
        "EV-1",
        "Reboot app-1",
        (
            Mark(t0, "scheduled"),
            Mark(t0 + timedelta(seconds=1), "drain", DRAIN_MARKS["drain_started"]),
            Mark(t0 + timedelta(seconds=4), "approved"),
            Mark(t0 + timedelta(seconds=30), "drain", DRAIN_MARKS["undrained"]),
        ),
    )
    page = render_html("Demo", [], [], data=ReportData(lanes=[lane]))
    assert page.count("mark mark-drain") == 3  # two on the lane, one in the legend
    assert "drain started" in page and "undrained" in page


def test_what_failed_comes_first_in_colour():
    """Issue 38: the headline was plain text, unmet outcomes sat among the met ones, and an
    event's "told" column left out a channel that failed. Now the terminal's checklist
    lists what is not met first, in red (the headline bold red; green when all met), the
    report opens with "Needs attention" (outcomes not met, channels that failed), and
    the told column names a failed channel first."""
    from local.report import ReportData, render_html
    from local.report_events import told_text

    outcomes = [Outcome("a", True), Outcome("b", False, "0 triggers"), Outcome("c", True)]
    lines = summary_lines(outcomes, colour=True)
    assert lines[0] == "\033[31m  [FAIL] b — 0 triggers\033[0m"
    assert lines[1] == "  [ok  ] a" and lines[-1].startswith("\033[1;31m  2/3 expected")
    assert summary_lines([Outcome("a", True)], colour=True)[-1].startswith("\033[32m")
    assert "\033" not in "".join(summary_lines(outcomes))  # no colour unless asked

    failed = SimpleNamespace(
        channel="slack", action=None, posted=False, error="RetryableDeliveryError: HTTP 500"
    )
    told = told_text([_delivery("teams"), failed, _delivery("pagerduty", "trigger")])
    assert told == "FAILED: slack (RetryableDeliveryError: HTTP 500); PagerDuty trigger, teams"

    data = ReportData(failed=[("slack", "EV-1", "decided", "RetryableDeliveryError: HTTP 500")])
    page = render_html("Demo", [], outcomes, data=data)
    attention = page.index("Needs attention")
    assert attention < page.index("Expected outcomes")
    assert attention < page.index("NOT met: b") < page.index("slack FAILED decided")
    assert '<p class="fail headline">2/3 expected outcomes met; 1 NOT met.</p>' in page
    checklist = page[page.index("Expected outcomes") :]
    assert checklist.index("<td>b</td>") < checklist.index("<td>a</td>")
    clean = render_html("Demo", [], [Outcome("a", True)], data=ReportData())
    assert "Needs attention" not in clean and 'class="ok headline"' in clean
