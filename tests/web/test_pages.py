"""The approval and fleet pages through real HTTP: sign-in, group, CSRF, replays, outcomes."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
import requests

from functions.model.event import Transition
from functions.notify import teams
from functions.pipeline.ingest import ingest_message
from functions.web.principal import encode_principal
from tests.functions.conftest import T0, envelope, event, make_pipeline
from tests.web.server import serve

BASE = "https://bridge.example"
GROUP = "6f1c2d3e-aaaa-4bbb-8ccc-000000000042"
ALICE = "1a2b3c4d-0000-4000-8000-00000000a11c"
BOB = "1a2b3c4d-0000-4000-8000-000000000b0b"
APP_SECRET = "app-secret-for-the-page-tests-0123456789abcdef"
PAGES_ON = {
    "app_secret": APP_SECRET,
    "public_base_url": BASE,
    "operators_group_id": GROUP,
    "website_auth_enabled": True,
}


def get(url: str, **kwargs: Any) -> requests.Response:
    return requests.get(url, timeout=30, **kwargs)


def send(url: str, **kwargs: Any) -> requests.Response:
    return requests.post(url, timeout=30, **kwargs)


def principal(oid: str = ALICE, name: str = "alice@contoso.example", groups=(GROUP,), roles=()):
    claims = [("http://schemas.microsoft.com/identity/claims/objectidentifier", oid)]
    claims += [("preferred_username", name)]
    claims += [("groups", g) for g in groups] + [("roles", r) for r in roles]
    return {
        "X-MS-CLIENT-PRINCIPAL": encode_principal(claims),
        "X-MS-CLIENT-PRINCIPAL-ID": oid,
        "X-MS-CLIENT-PRINCIPAL-NAME": name,
        "X-MS-CLIENT-PRINCIPAL-IDP": "aad",
    }


@pytest.fixture
def held(store, clock, relay):
    """A platform Reboot the default policy holds, reported by vm1 (whose relay answers)."""
    pipeline, pub = make_pipeline(store, clock, **PAGES_ON)
    body = envelope("vm1", 1, [event("EV-PG", "Reboot")], callback_url=relay.url)
    ingest_message(body, pipeline)
    assert pub.transitions("EV-PG") == ["scheduled", "decided"]
    return pipeline, pub


def open_page(url: str, headers: dict[str, str]) -> tuple[str, str, requests.Response]:
    """GET the event page; (token, cookie value, response)."""
    page = get(f"{url}/api/pages/events/EV-PG", headers=headers, allow_redirects=False)
    assert page.status_code == 200, page.text
    token = re.search(r'name="token" value="([^"]+)"', page.text)[1]
    cookie = page.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" in cookie
    return token, cookie.split(";")[0].split("=", 1)[1], page


def post(
    url: str,
    headers: dict[str, str],
    token: str | None,
    cookie: str | None,
    how: str | None = None,
    **extra: Any,
):
    sent = {**headers, "Origin": BASE, **extra}
    if cookie is not None:
        sent["Cookie"] = f"__Host-sebridge-approve={cookie}"
    data = {} if token is None else {"token": token}
    if how is not None:
        data["how"] = how
    return send(
        f"{url}/api/pages/events/EV-PG/approve", data=data, headers=sent, allow_redirects=False
    )


def test_approve_from_the_page_round_trip(held, relay, store):
    pipeline, pub = held
    alice = principal()
    with serve(pipeline) as url:
        token, cookie, page = open_page(url, alice)
        assert "Reboot" in page.text and "vm1" in page.text and "default-hold" in page.text
        assert "data-countdown" in page.text and '<g class="lane"' in page.text
        assert "Content-Security-Policy" in page.headers
        done = post(url, alice, token, cookie)
        assert done.status_code == 200, done.text
        assert "Approved by alice@contoso.example" in done.text
        # Replayed: the same form again does nothing, whatever happened the first time.
        again = post(url, alice, token, cookie)
        assert again.status_code == 409 and "already used" in again.text
        # The page now says so and offers no button.
        after = get(f"{url}/api/pages/events/EV-PG", headers=alice)
        assert "Already approved" in after.text and 'name="token"' not in after.text
    assert relay.starts() == ["EV-PG"]
    audit = store.audit_rows("EV-PG")
    # The Entra object id names who approved; the display name is only beside it.
    assert audit[-1]["by"] == f"manual:oid:{ALICE} (alice@contoso.example)"
    assert audit[-1]["outcome"] == "approved via relay:vm1"
    approved = [n for n in pub.published if n.transition is Transition.APPROVED]
    assert f"approved by oid:{ALICE} (alice@contoso.example)" in approved[0].detail


def test_two_operators_with_one_display_name_stay_apart(held, relay, store):
    """Bob renames himself "alice@contoso.example": the audit still says it was Bob."""
    pipeline, _ = held
    impostor = principal(oid=BOB, name="alice@contoso.example\x07forged line")
    with serve(pipeline) as url:
        token, cookie, _ = open_page(url, impostor)
        assert post(url, impostor, token, cookie).status_code == 200
    by = store.audit_rows("EV-PG")[-1]["by"]
    assert by == f"manual:oid:{BOB} (alice@contoso.example forged line)"
    assert ALICE not in by


def test_a_token_keyed_by_the_relay_key_is_refused(held, relay):
    """Page tokens are keyed by APP_SECRET (contract §6), never by anything a relay holds:
    a token made with the old RELAY_KEY-derived key (or RELAY_KEY itself) is refused."""
    import hashlib
    import hmac

    from functions.web import csrf
    from tests.functions.conftest import KEY

    pipeline, _ = held
    alice = principal()
    old_label = b"scheduled-events-bridge approval page token v1"
    keys = [
        hmac.new(KEY.encode(), old_label, hashlib.sha256).digest(),
        hmac.new(KEY.encode(), b"page-token/v1", hashlib.sha256).digest(),
        KEY.encode(),
    ]
    with serve(pipeline) as url:
        _, cookie, _ = open_page(url, alice)
        for key in keys:
            forged = csrf.issue_token(key, ALICE, "EV-PG", cookie, T0.timestamp())
            response = post(url, alice, forged, cookie)
            assert response.status_code == 403 and "not valid for you" in response.text
    assert relay.starts() == []
    expected = hmac.new(APP_SECRET.encode(), b"page-token/v1", hashlib.sha256).digest()
    assert pipeline.settings.page_token_key == expected


def test_rotating_app_secret_voids_open_forms(held, relay, store, clock):
    """A new APP_SECRET (a new host start) refuses the forms issued under the old one:
    the operator opens the page again. Nothing else is keyed by it on the pages."""
    pipeline, _ = held
    alice = principal()
    with serve(pipeline) as url:
        token, cookie, _ = open_page(url, alice)
    rotated, _ = make_pipeline(store, clock, **{**PAGES_ON, "app_secret": "r" * 40})
    with serve(rotated) as url:
        refused = post(url, alice, token, cookie)
        assert refused.status_code == 403 and "not valid for you" in refused.text
        token, cookie, _ = open_page(url, alice)
        assert post(url, alice, token, cookie).status_code == 200


def test_app_secret_must_be_long_enough():
    from functions.settings import SettingsInvalid, load_settings

    with pytest.raises(SettingsInvalid, match="app_secret"):
        load_settings(app_secret="short")
    reference = "@Microsoft.KeyVault(SecretUri=https://kv.vault.azure.net/secrets/app-secret)"
    with pytest.raises(SettingsInvalid, match="APP_SECRET is an unresolved Key Vault"):
        load_settings(app_secret=reference)  # never a key: the app stops, naming it


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"token": None}, "malformed"),
        ({"token": "1.2.3"}, "not valid for you"),
        ({"tamper": True}, "not valid for you"),
        ({"cookie": None}, "cookie is missing"),
        ({"cookie": "another-browser"}, "not valid for you"),
        ({"Origin": "https://evil.example"}, "cross-site"),
        ({"Origin": None}, "neither Origin nor Referer"),
        ({"Origin": None, "Referer": "https://evil.example/x"}, "Referer is another site"),
        ({"Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site"),
        ({"user": BOB}, "not valid for you"),
    ],
)
def test_forms_that_are_refused(held, relay, change, why):
    pipeline, _ = held
    alice = principal()
    with serve(pipeline) as url:
        token, cookie, _ = open_page(url, alice)
        headers = dict(alice)
        if "user" in change:  # bob is an operator too, but the form was alice's
            headers = principal(oid=BOB, name="bob@contoso.example")
        if "tamper" in change:
            token = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
        if "token" in change:
            token = change["token"]
        if "cookie" in change:
            cookie = change["cookie"]
        extra = {k: v for k, v in change.items() if k[0].isupper() and v is not None}
        sent_headers = {**headers, **extra}
        response = send(
            f"{url}/api/pages/events/EV-PG/approve",
            data={} if token is None else {"token": token},
            headers={
                **({"Origin": BASE} if "Origin" not in change else {}),
                **sent_headers,
                **({"Cookie": f"__Host-sebridge-approve={cookie}"} if cookie else {}),
            },
            allow_redirects=False,
        )
    assert response.status_code == 403, response.text
    assert why in response.text
    assert relay.starts() == []


def test_an_expired_form_is_refused(held, relay, clock):
    pipeline, _ = held
    alice = principal()
    with serve(pipeline) as url:
        token, cookie, _ = open_page(url, alice)
        clock.advance(31 * 60)
        response = post(url, alice, token, cookie)
    assert response.status_code == 403 and "expired" in response.text
    assert relay.starts() == []


def test_an_event_approved_meanwhile(held, relay, store):
    pipeline, _ = held
    alice = principal()
    with serve(pipeline) as url:
        token, cookie, _ = open_page(url, alice)
        # Someone else approves through the API (or the watchdog) while the page is open.
        from functions.web.approval import approve_by_hand

        assert approve_by_hand(pipeline, "EV-PG", "bob").outcome == "approved"
        response = post(url, alice, token, cookie)
    assert response.status_code == 409
    assert "already approved" in response.text
    assert relay.starts() == ["EV-PG"]
    assert store.audit_rows("EV-PG")[-1]["outcome"] == "skipped: already approved"


def test_dry_run_offers_no_button(store, clock, relay):
    from functions.model.policy import Policy

    pipeline, _ = make_pipeline(store, clock, Policy(dry_run=True), **PAGES_ON)
    ingest_message(envelope("vm1", 1, [event("EV-PG")], callback_url=relay.url), pipeline)
    with serve(pipeline) as url:
        page = get(f"{url}/api/pages/events/EV-PG", headers=principal())
    assert page.status_code == 200 and 'name="token"' not in page.text
    assert "POLICY__DRY_RUN is on" in page.text


def _b64(data: Any) -> str:
    return base64.b64encode(json.dumps(data).encode()).decode()


@pytest.mark.parametrize(
    ("headers", "status", "why"),
    [
        ({"X-MS-CLIENT-PRINCIPAL": "not base64!"}, 403, "not base64-encoded JSON"),
        ({"X-MS-CLIENT-PRINCIPAL": _b64(["a"])}, 403, "no claims list"),
        (
            {"X-MS-CLIENT-PRINCIPAL": _b64({"auth_typ": "github", "claims": []})},
            403,
            "not Entra ID",
        ),
        ({**principal(), "X-MS-CLIENT-PRINCIPAL-ID": BOB}, 403, "disagree"),
        ({**principal(), "X-MS-CLIENT-PRINCIPAL-IDP": "google"}, 403, "disagree"),
        (principal(groups=("another-group",)), 403, "not in the operators"),
        (principal(groups=()), 403, "not in the operators"),
    ],
)
def test_sign_in_that_is_refused(held, headers, status, why):
    pipeline, _ = held
    with serve(pipeline) as url:
        for path in ("/api/pages/events/EV-PG", "/api/pages/fleet"):
            response = get(url + path, headers=headers, allow_redirects=False)
            assert response.status_code == status, response.text
            assert why in response.text


def test_nobody_signed_in_is_sent_to_sign_in(held, relay):
    pipeline, _ = held
    with serve(pipeline) as url:
        page = get(f"{url}/api/pages/events/EV-PG", allow_redirects=False)
        assert page.status_code == 302
        assert page.headers["Location"] == (
            "/.auth/login/aad?post_login_redirect_uri=/api/pages/events/EV-PG"
        )
        posted = post(url, {}, "1.x.y", "c")
        assert posted.status_code == 401
    assert relay.starts() == []


def test_an_app_role_admits_too(store, clock, relay):
    settings = {**PAGES_ON, "operators_group_id": None, "operators_app_role": "Bridge.Operator"}
    pipeline, _ = make_pipeline(store, clock, **settings)
    ingest_message(envelope("vm1", 1, [event("EV-PG")], callback_url=relay.url), pipeline)
    with serve(pipeline) as url:
        ok = get(f"{url}/api/pages/fleet", headers=principal(roles=("Bridge.Operator",)))
        no = get(f"{url}/api/pages/fleet", headers=principal(roles=("bridge.operator",)))
    assert ok.status_code == 200 and no.status_code == 403


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"operators_group_id": None}, "neither OPERATORS_GROUP_ID nor OPERATORS_APP_ROLE"),
        # Without App Service Authentication anyone could write the header: a perfect
        # forgery of an operator's principal must not get in.
        ({"website_auth_enabled": False}, "App Service Authentication is not enabled"),
        ({"public_base_url": None}, "neither PUBLIC_BASE_URL nor WEBSITE_HOSTNAME"),
        ({"app_secret": None}, "APP_SECRET is not set"),
    ],
)
def test_pages_off_say_why_and_cards_carry_no_button(store, clock, relay, settings, why):
    pipeline, pub = make_pipeline(store, clock, **{**PAGES_ON, **settings})
    ingest_message(envelope("vm1", 1, [event("EV-PG")], callback_url=relay.url), pipeline)
    with serve(pipeline) as url:
        for path in ("/api/pages/events/EV-PG", "/api/pages/fleet"):
            page = get(url + path, headers=principal(), allow_redirects=False)
            assert page.status_code == 404 and why in page.text
    decided = pub.published[-1]
    assert decided.links.approve_url is None and decided.links.status_url is None
    assert "actions" not in teams.build_card(decided, T0)


def test_cards_link_the_pages_and_never_a_key(held):
    _, pub = held
    decided = pub.published[-1]
    card = teams.build_card(decided, T0)
    urls = {a["title"]: a["url"] for a in card["actions"]}
    assert urls == {
        "Approve manually": f"{BASE}/api/pages/events/EV-PG",
        "Fleet status": f"{BASE}/api/pages/fleet",
    }
    assert "code=" not in json.dumps(card)


def test_public_base_url_defaults_from_the_real_host_name(monkeypatch):
    from functions.settings import load_settings

    monkeypatch.delenv("PUBLIC_BASE_URL", raising=False)
    monkeypatch.setenv("WEBSITE_HOSTNAME", "func-x-abc123.westeurope-01.azurewebsites.net")
    assert load_settings().base_url == "https://func-x-abc123.westeurope-01.azurewebsites.net"
    monkeypatch.setenv("PUBLIC_BASE_URL", "https://ops.contoso.example/")
    assert load_settings().base_url == "https://ops.contoso.example"


def test_fleet_page_shows_the_status_data_and_a_timeline(held, store):
    pipeline, _ = held
    with serve(pipeline) as url:
        page = get(f"{url}/api/pages/fleet", headers=principal())
        ended = get(f"{url}/api/pages/fleet?all=true", headers=principal())
    assert page.status_code == 200
    assert 'href="/api/pages/events/EV-PG"' in page.text
    assert "hold (default-hold)" in page.text and "Policy valid" in page.text
    assert page.text.count('<g class="lane"') == 1
    assert "open events only" in ended.text


def test_the_event_page_shows_the_impact_ledger(store, clock, relay):
    """Issue 33: what each VM's relay measured, beside what Azure advertised, and how to
    export it; a VM whose relay sent nothing says so."""
    pipeline, _ = make_pipeline(store, clock, **PAGES_ON)
    scheduled = event("EV-PG", "Freeze", resources=("vm1", "vm2"), duration=5)
    started = {**scheduled, "EventStatus": "Started", "NotBefore": ""}
    ingest_message(envelope("vm1", 1, [scheduled], callback_url=relay.url), pipeline)
    ingest_message(envelope("vm2", 1, [scheduled], callback_url=relay.url), pipeline)
    polls = {"max_gap_s": 6.25, "wall_jump_s": 5.5}  # vm2's relay is older: it sends none
    ingest_message(envelope("vm1", 2, [started], polls=polls), pipeline)
    with serve(pipeline) as url:
        page = get(f"{url}/api/pages/events/EV-PG", headers=principal())
    assert page.status_code == 200, page.text
    assert "<h2>Impact ledger</h2>" in page.text
    assert "<td>6.25 s</td><td>+5.5 s</td>" in page.text
    assert "vm2 (no relay measurements)" in page.text
    assert "python -m functions ledger EV-PG --csv" in page.text
    assert "vm1: its relay saw Started" in page.text  # its mark on the timeline


def test_the_page_says_approving_by_hand_skips_the_drain_and_offers_drain_then_approve(
    held, relay, store
):
    """Issue 45: the page's one button approved a held Reboot undrained and did not say so
    (2f59d6a). Now it says what approving by hand skips and offers "drain, then approve":
    the person's drain replaces the hold for every view, is audited, and the event is due
    for the decider, which drains, then approves (the relay is not asked yet)."""
    pipeline, _ = held
    alice = principal()
    with serve(pipeline) as url:
        token, cookie, page = open_page(url, alice)
        assert "Approving by hand skips the drain" in page.text
        assert 'name="how" value="drain"' in page.text and "Drain, then approve as" in page.text
        assert "Approve now, undrained, as" in page.text
        done = post(url, alice, token, cookie, how="drain")
        assert done.status_code == 202, done.text
        assert "Drain asked: the bridge takes it out of service, then approves it" in done.text
        token, cookie, page = open_page(url, alice)
        assert 'value="drain"' not in page.text  # draining now: only "approve now" is left
        assert "The policy drains this event and approves it once drained" in page.text
    record = store.get_event("EV-PG")
    assert record.decision.action == "drain" and record.decision.rule == "manual-drain"
    assert {e.decision.action for e in record.views} == {"drain"}
    assert store.audit_rows("EV-PG")[-1]["outcome"] == "asked"
    assert relay.starts() == []  # nothing approved before the drain
    assert record.redecided_at is not None  # announced again as a re-decision
