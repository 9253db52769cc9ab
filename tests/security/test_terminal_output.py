"""What operators read in a terminal or a spreadsheet is a VM's words as text, never as
control (issue 46, "What operators read"): ESC and BEL sequences in an EventType or
EventId came out raw from `policy explain`, `policy backtest` and `ledger --csv` (OSC 52
writes the clipboard), and `Reboot;=cmd|...` started a formula in `;`-separator locales."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from functions.__main__ import main
from functions.ledger import spreadsheet_safe
from functions.terminal import printable

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # "set the clipboard to `echo pwned`"


def test_control_characters_are_shown_escaped_newlines_and_tabs_kept() -> None:
    assert printable(f"Reboot{OSC52}") == "Reboot\\x1b]52;c;ZWNobyBwd25lZA==\\x07"
    assert printable("a\u202eb\x9bc") == "a\\u202eb\\x9bc"
    assert printable("line one\n\tline two") == "line one\n\tline two"


def test_policy_explain_prints_no_escape_sequence_a_vm_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = {
        "DocumentIncarnation": 3,
        "Events": [
            {
                "EventId": f"EV{OSC52}1",
                "EventStatus": "Scheduled",
                "EventType": f"Reboot{OSC52}",
                "ResourceType": "VirtualMachine",
                "Resources": ["web_1"],
                "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            }
        ],
    }
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(document))
    main(["policy", "explain", str(path), "--now", "2016-09-19T18:00:00Z"])
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\x07" not in out + err
    shown = out + err  # shown, not dropped: the operator sees what was sent
    assert "\\x1b" in shown or "\\u001b" in shown


@pytest.mark.parametrize(
    "cell",
    ["=cmd|' /C calc'!A0", "Reboot;=cmd|' /C calc'!A0", "Reboot, +1", "x\t@SUM(A1)", "a; -2+3"],
)
def test_a_cell_that_any_locale_reads_as_a_formula_opens_as_text(cell: str) -> None:
    safe = spreadsheet_safe(cell)
    assert safe.startswith("'")
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_NONNUMERIC).writerow([safe, 1.5])
    line = out.getvalue()
    assert line.startswith("\"'") and line.rstrip().endswith(",1.5")  # quoted whole; numbers not


def test_ordinary_words_and_numbers_are_left_alone() -> None:
    assert spreadsheet_safe("Reboot") == "Reboot"
    assert spreadsheet_safe("web_1, web_2") == "web_1, web_2"
    assert spreadsheet_safe(-2.5) == -2.5


def test_every_command_prints_through_the_escaping_stream(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard sits in `main`, so a command added later (or a warning printed raw) is
    covered too: here a command that fails in argparse with a VM's word in its message."""
    code = None
    try:
        main(["ledger", f"EV{OSC52}", "--no-such-flag"])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and "\x1b" not in out + err


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks:s3cr?tpass@receiver.example/post",
        "https://hooks:s3cr#tpass@receiver.example/post",
        "https://hooks:12ab34@receiver.example/post",
    ],
)
def test_settings_check_says_what_is_wrong_with_a_url_not_its_password(url: str) -> None:
    """Issue 46: a WEBHOOK_URL password with ? or # was partly printed by `settings check`
    (and logged): urlsplit read part of it as the port and quoted it."""
    from functions.notify.endpoints import endpoint_warnings, unusable_url

    said = " ".join(filter(None, [unusable_url("WEBHOOK_URL", url)]))
    said += " ".join(endpoint_warnings("WEBHOOK_URL", url))
    for part in ("s3cr", "tpass", "12ab34"):
        assert part not in said, said


def test_the_demo_report_names_no_real_channel_url() -> None:
    """Issue 46: with a real SLACK_WEBHOOK_URL set, out/demo-report.html printed the URL
    and its token. Whatever text of the report quotes it, the written file does not."""
    from local.report import without_secrets

    url = "https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/abcdefghijklmnopqrstuvwx"
    page = f"<p>slack: HTTP 404 from {url}: no_team (token abcdefghijklmnopqrstuvwx)</p>"
    shown = without_secrets(page, {"SLACK_WEBHOOK_URL": url, "WEBHOOK_SECRET": ""})
    assert "abcdefghijklmnopqrstuvwx" not in shown and "B0BBBBBBB" not in shown
    assert "[redacted]" in shown and "no_team" in shown
