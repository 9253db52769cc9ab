"""The fleet page shows coverage (issue 44 item 4): VMs in scope with no relay heard, relays
silent, versions, contracts and the drain each VM has, from the coverage summary row; the
web test server renders it, and names from the fleet stay escaped."""

from __future__ import annotations

from datetime import timedelta

from functions.pipeline.coverage import run_coverage
from functions.web.views import fleet_status
from tests.functions.conftest import make_pipeline
from tests.functions.test_coverage import enrol, heartbeat
from tests.web.server import serve
from tests.web.test_pages import PAGES_ON, get, principal


def test_the_fleet_page_shows_coverage(store, clock):
    pipeline, _ = make_pipeline(store, clock, **PAGES_ON)
    with serve(pipeline) as url:
        text = get(f"{url}/api/pages/fleet", headers=principal()).text
    assert "<h2>Coverage</h2>" in text and "No coverage pass yet" in text
    now = clock.now()
    enrol(pipeline, "cold<b>_0", keyed=False)
    enrol(pipeline, "web_0")
    heartbeat(store, "web_0", now, probe_at=int(now.timestamp()) - 3)
    enrol(pipeline, "batch_0")
    heartbeat(store, "batch_0", now - timedelta(hours=2), version="0.1.9")
    assert run_coverage(pipeline) is not None
    with serve(pipeline) as url:
        page = get(f"{url}/api/pages/fleet", headers=principal())
    assert page.status_code == 200, page.text
    text = page.text
    assert "Some VMs are not covered" in text
    assert "VMs in scope (identity sync)</td><td>3" in text
    assert "cold&lt;b&gt;_0" in text and "cold<b>_0" not in text
    assert "relays silent</td><td><span class=warn>1</span><br><small>batch_0" in text
    assert "0.1.9: 1, 0.2.0: 1" in text
    assert "relay contracts (this app accepts 1, 2)</td><td>2: 2" in text
    assert "drain: readiness probe (a load balancer probes its relay)</td><td>1" in text
    assert "no drain on this VM: held (Platform) / approved at once (User)" in text
    assert fleet_status(pipeline, False)["coverage"]["no_relay"] == 1  # /api/status's body
