"""The operators' pages on one machine (issue 38, item 8), in a real browser.

The demo's stack (simulator, a real relay per VM, Azurite, the local host) with
local.pages_server in front of the app's own page code: Debian's chromium, headless, opens
the fleet page and a held event's page as the stand-in local operator, sees both marked
LOCAL, presses Approve, and the approval goes the usual way: the VM's relay posts
StartRequests to its IMDS (the simulator records it). Before this, a newcomer could see
none of these pages without a real deployment.
"""

from __future__ import annotations

import time

import pytest
import requests

from local.demo_pages import HELD_EVENT, HELD_VM, hold_one_for_approval, start_pages
from local.options import DemoOptions
from local.orchestration import Demo
from local.pages_server import LOCAL_OPERATOR_NAME, local_principal
from local.report import Timeline
from tests.e2e.browser import Browser, chromium
from tests.e2e.conftest import clean_env

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pages-local")]


@pytest.fixture(scope="module")
def served():
    chromium()  # skips (outside CI) before anything starts when there is no browser
    demo = Demo(DemoOptions(plan=(), report=None, env=clean_env()), Timeline(stream=None))
    with demo:
        server = start_pages(demo)
        held = hold_one_for_approval(demo)
        assert held, f"the {HELD_EVENT} of {HELD_VM} was never held"
        yield demo, server, held


def test_a_held_event_is_approved_from_its_page_in_a_browser(served) -> None:
    demo, server, held = served
    with Browser() as browser:
        browser.open(server.fleet_url)
        fleet = str(browser.evaluate("document.body.innerText"))
        assert "LOCAL" in fleet and LOCAL_OPERATOR_NAME in fleet
        assert held[:8] in fleet  # the fleet page lists the held event, linked
        browser.evaluate(f"document.querySelector('a[href*=\"{held}\"]').click()")
        browser.wait_for("document.querySelector('form button') !== null")
        page = str(browser.evaluate("document.body.innerText"))
        assert "LOCAL" in page and HELD_EVENT in page and HELD_VM in page
        # Both ways to approve a held event, and what approving by hand skips (issue 45).
        assert f"Drain, then approve as {LOCAL_OPERATOR_NAME}" in page
        assert f"Approve now, undrained, as {LOCAL_OPERATOR_NAME}" in page
        assert "skips the drain" in page
        browser.evaluate("document.querySelector('form button[value=\"now\"]').click()")
        result = str(
            browser.wait_for(
                "document.body.innerText.includes('Approved by') && document.body.innerText"
            )
        )
    assert f"Approved by {LOCAL_OPERATOR_NAME}, via relay" in result
    # The approval reached Azure's side: the relay of the VM sent StartRequests to IMDS.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if any(a.event_id == held for a in demo.watcher.approvals):
            break
        time.sleep(0.2)
    assert [a.event_id for a in demo.watcher.approvals].count(held) == 1
    audit = demo.store.audit_rows(held)
    assert any(LOCAL_OPERATOR_NAME in str(row.get("by", "")) for row in audit), audit


def test_the_stand_in_replaces_any_principal_a_client_sends(served) -> None:
    """As App Service does: a client's own X-MS-CLIENT-PRINCIPAL never reaches the pages;
    the server speaks only for its one local operator, and only on loopback."""
    _, server, _ = served
    forged = local_principal().replace("local", "x")  # not even valid base64 JSON any more
    answer = requests.get(server.fleet_url, headers={"X-MS-CLIENT-PRINCIPAL": forged}, timeout=10)
    assert answer.status_code == 200 and "LOCAL" in answer.text
    assert server.base_url.startswith("http://127.0.0.1:")
    assert requests.get(server.base_url + "/elsewhere", timeout=10).status_code == 404


def test_a_form_from_another_origin_is_refused(served) -> None:
    """The app's own cross-site checks still hold behind the stand-in."""
    _, server, held = served
    answer = requests.post(
        server.event_url(held) + "/approve",
        data={"token": "x"},
        headers={"Origin": "https://elsewhere.example"},
        timeout=10,
    )
    assert answer.status_code == 403


def test_make_demo_serve_links_the_pages_and_stops_on_ctrl_c(tmp_path) -> None:
    """`python -m local.demo --serve` (make demo SERVE=1): after its outcomes it prints where
    the fleet, an event and the approval page are, serves them until Ctrl-C, then stops
    everything it started and exits 0 (every outcome met)."""
    import os
    import signal
    import subprocess
    import sys

    plan = tmp_path / "plan.json"
    plan.write_text('[{"at": 0, "scenario": "live-migration", "target": "web-1"}]')
    plan_args = ["--plan", str(plan)]  # the plan alone: the pages, not the upgrade lane
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "local.demo",
            "--serve",
            "--no-report",
            "--no-upgrade-lane",
            *plan_args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(PYTHONUNBUFFERED="1"),
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "the demo ended before serving:\n" + "".join(lines)
            lines.append(line)
            if line.strip().startswith("approve:"):
                break
        text = "".join(lines)
        links = {
            line.split(":", 1)[0].strip(): line.split(":", 1)[1].split()[0]
            for line in lines
            if line.strip().startswith(("fleet:", "an event:", "approve:"))
        }
        assert "Operators' pages, LOCAL" in text, text
        assert set(links) == {"fleet", "an event", "approve"}, text
        for url in links.values():
            answer = requests.get(url, timeout=10)
            assert answer.status_code == 200 and "LOCAL" in answer.text, url
        assert "Approve now, undrained, as" in requests.get(links["approve"], timeout=10).text
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, text + rest
