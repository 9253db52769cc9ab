"""The Azure handlers are thin: they pass the request to the page functions and hand back
status, headers (cookie included) and body unchanged; the routes are anonymous at the
function level (App Service Authentication signs people in) and never need a key."""

from __future__ import annotations

import re

import azure.functions as func

from functions.pipeline.ingest import ingest_message
from functions.triggers import core, pages
from tests.functions.conftest import envelope, event, make_pipeline
from tests.web.test_pages import BASE, PAGES_ON, principal


def _user(builder):
    return builder._function.get_user_function()


def _route(builder) -> dict:
    return builder._function.get_trigger().get_dict_repr()


def test_routes_are_anonymous_and_under_pages():
    assert _route(pages.page_event)["route"] == "pages/events/{event_id}"
    assert _route(pages.page_approve)["route"] == "pages/events/{event_id}/approve"
    assert _route(pages.page_fleet)["route"] == "pages/fleet"
    for builder in (pages.page_event, pages.page_approve, pages.page_fleet):
        assert _route(builder)["authLevel"] == func.AuthLevel.ANONYMOUS


def test_a_page_approval_through_the_azure_handlers(store, clock, relay):
    pipeline, pub = make_pipeline(store, clock, **PAGES_ON)
    ingest_message(envelope("vm1", 1, [event("EV-AZ")], callback_url=relay.url), pipeline)
    core.use_pipeline(pipeline)
    try:
        got = _user(pages.page_event)(
            func.HttpRequest(
                "GET",
                f"{BASE}/api/pages/events/EV-AZ",
                headers=principal(),
                route_params={"event_id": "EV-AZ"},
                body=b"",
            )
        )
        assert got.status_code == 200 and got.mimetype == "text/html"
        page = got.get_body().decode()
        token = re.search(r'name="token" value="([^"]+)"', page)[1]
        cookie = got.headers["Set-Cookie"].split(";")[0]
        assert "Content-Security-Policy" in got.headers
        done = _user(pages.page_approve)(
            func.HttpRequest(
                "POST",
                f"{BASE}/api/pages/events/EV-AZ/approve",
                headers={**principal(), "Origin": BASE, "Cookie": cookie},
                route_params={"event_id": "EV-AZ"},
                body=f"token={token}".encode(),
            )
        )
        assert done.status_code == 200, done.get_body()
        fleet = _user(pages.page_fleet)(
            func.HttpRequest("GET", f"{BASE}/api/pages/fleet", headers={}, body=b"")
        )
        assert fleet.status_code == 302
        assert fleet.headers["Location"].startswith("/.auth/login/aad?")
    finally:
        core.use_pipeline(None)
    assert relay.starts() == ["EV-AZ"]
    assert pub.transitions("EV-AZ")[-1] == "approved"
