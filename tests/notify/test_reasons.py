"""Delivery failures say why, once per attempt, naming no secret (issue 38, item 6).

`InvalidSchema` and `ConnectionError` said nothing about the scheme, DNS, a proxy, TLS or a
status, and a failure was logged by post_json, again by dispatch, and a third time by the
host with the exception. Each case here is real: a refused port, a plain-HTTP server
spoken to in TLS, a proxy that is not there, a receiver that answers slowly or refuses
and echoes the URL. Only name resolution is stood in for (no query leaves the machine).
"""

from __future__ import annotations

import logging
import socket

import pytest
import requests

from functions.model.event import Transition
from functions.notify import dispatch
from functions.notify.delivery import (
    DeliveryError,
    PermanentDeliveryError,
    RetryableDeliveryError,
    RetryPolicy,
    Transport,
    post_json,
)
from functions.notify.settings import ChannelSettings
from tests.conftest import free_port
from tests.notify.factory import decision, event, note
from tests.notify.receiver import Answer, running

SECRET = "sig=0123456789abcdefSECRET"
PATH = "/workflows/3f2a9c/triggers/manual/paths/invoke"


def transport(attempts: int = 2, **session: object) -> Transport:
    http = requests.Session()
    for name, value in session.items():
        setattr(http, name, value)
    policy = RetryPolicy(attempts=attempts, backoff_seconds=0.001, read_timeout=0.5)
    return Transport(http, policy, sleep=lambda _s: None)


def failed(caplog: pytest.LogCaptureFixture, url: str, attempts: int = 2, **session: object):
    """Deliver a Teams card to `url` the way the app does; (the error, every log line)."""
    settings = ChannelSettings(teams_webhook_url=url)
    body = note(Transition.DECIDED, event(), decision()).to_json()
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.raises(DeliveryError) as caught:
        dispatch.deliver("teams", body, settings=settings, transport=transport(attempts, **session))
    lines = [r.getMessage() for r in caplog.records]
    for text in [*lines, str(caught.value)]:
        assert SECRET not in text and PATH not in text, text  # never the URL's secret
    return caught.value, lines


def attempts_logged(lines: list[str]) -> list[str]:
    return [line for line in lines if "attempt" in line and "failed" in line]


def test_a_refused_connection_is_named_once_per_attempt(caplog) -> None:
    port = free_port()
    error, lines = failed(caplog, f"http://127.0.0.1:{port}{PATH}?{SECRET}", attempts=3)
    assert isinstance(error, RetryableDeliveryError)
    assert f"http://127.0.0.1:{port} refused the connection" in error.reason
    logged = attempts_logged(lines)
    assert [line.split(" failed")[0] for line in logged] == [
        "teams: attempt 1/3",
        "teams: attempt 2/3",
        "teams: attempt 3/3",
    ]
    # Each attempt's reason once: no second line for the same failure.
    assert sum("refused the connection" in line for line in lines) == 3, lines


def test_tls_to_a_server_that_does_not_speak_it(caplog) -> None:
    with running(Answer(200)) as plain:
        url = plain.url.replace("http://", "https://") + PATH + "?" + SECRET
        error, lines = failed(caplog, url)
    assert "TLS with https://127.0.0.1:" in error.reason, error.reason
    assert len(attempts_logged(lines)) == 2


def test_a_proxy_that_is_not_there(caplog) -> None:
    with running(Answer(200)) as target:
        proxy = f"http://127.0.0.1:{free_port()}"
        error, _ = failed(
            caplog, target.url + PATH + "?" + SECRET, proxies={"http": proxy}, trust_env=False
        )
    assert "the proxy failed the connection to http://127.0.0.1:" in error.reason, error.reason


def test_a_name_that_does_not_resolve(caplog, monkeypatch) -> None:
    real = socket.getaddrinfo

    def resolver(host, *args, **kwargs):
        if host == "prod-00.westeurope.logic.azure.com":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    url = f"https://prod-00.westeurope.logic.azure.com{PATH}?{SECRET}"
    error, _ = failed(caplog, url, trust_env=False)
    assert "the name 'prod-00.westeurope.logic.azure.com' does not resolve" in error.reason


def test_a_slow_receiver_is_a_timeout_with_its_limit(caplog) -> None:
    with running(Answer(200, delay=1.5)) as slow:
        error, _ = failed(caplog, slow.url + PATH + "?" + SECRET)
    assert "did not answer within 0.5 s" in error.reason, error.reason


def test_a_refusal_names_the_status_and_redacts_an_echoed_url(caplog) -> None:
    echo = {"error": f"no flow at {PATH}?{SECRET}", "hint": "check the trigger URL"}
    with running(Answer(404, echo)) as receiver:
        error, lines = failed(caplog, receiver.url + PATH + "?" + SECRET)
    assert isinstance(error, PermanentDeliveryError) and error.status == 404
    assert error.reason.startswith("HTTP 404 from http://127.0.0.1:")
    assert "[redacted]" in error.reason and "check the trigger URL" in error.reason
    assert len(attempts_logged(lines)) == 1 and "not retried" in attempts_logged(lines)[0]


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("htps://prod-00.westeurope.logic.azure.com/x?" + SECRET, "scheme 'htps' is not http"),
        ("prod-00.westeurope.logic.azure.com/x?" + SECRET, "has no scheme"),
    ],
)
def test_a_url_no_retry_can_fix_says_what_is_wrong_with_it(url: str, said: str) -> None:
    with pytest.raises(PermanentDeliveryError) as caught:
        post_json(transport(), "teams", url, b"{}")
    assert said in caught.value.reason and SECRET not in caught.value.reason
