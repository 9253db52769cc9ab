"""The shared HMAC request signing."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from functions.signing import SignatureError, sign_headers, signature, verify

KEY = b"0123456789abcdef-test-key"


def test_signature_is_hmac_over_timestamp_method_path_body():
    body = b'{"EventIds":["e1"]}'
    expected = hmac.new(KEY, b"1700000000\nPOST\n/v1/start\n" + body, hashlib.sha256).hexdigest()
    assert signature(KEY, 1700000000, "post", "/v1/start", body) == "v1=" + expected


def test_verify_accepts_fresh_valid_and_refuses_the_rest():
    body = b"{}"
    headers = sign_headers(KEY, "POST", "/v1/start", body, now=1000)
    assert verify(KEY, headers, "POST", "/v1/start", body, now=1100).startswith("v1=")
    with pytest.raises(SignatureError, match="stale"):
        verify(KEY, headers, "POST", "/v1/start", body, now=1000 + 301)
    with pytest.raises(SignatureError, match="bad signature"):
        verify(b"another-key-0000000", headers, "POST", "/v1/start", body, now=1000)
    with pytest.raises(SignatureError, match="bad signature"):
        verify(KEY, headers, "POST", "/v1/drain", body, now=1000)
    with pytest.raises(SignatureError, match="bad signature"):
        verify(KEY, headers, "POST", "/v1/start", b"{ }", now=1000)
    with pytest.raises(SignatureError, match="missing"):
        verify(KEY, {}, "POST", "/v1/start", body, now=1000)
    with pytest.raises(SignatureError, match="malformed"):
        verify(KEY, {**headers, "X-Relay-Timestamp": "-5"}, "POST", "/v1/start", body, now=1000)


# --------------------------------------------------------------------------- v2 (issue 22)

import relay.signing as relay_signing  # noqa: E402
from functions import signing as app_signing  # noqa: E402

SECRET = bytes.fromhex("11" * 32)
KID = hashlib.sha256(SECRET).hexdigest()[:16]
VM = "0f8fad5b-d9cb-469f-a165-70867728950e"
OTHER = "7c9e6679-7425-40de-944b-e07fc1f90ae7"


def test_v2_headers_are_the_contract():
    module = app_signing  # the app signs; the relay only verifies (relay/signing.py)
    body = b'{"EventIds":["e1"]}'
    headers = module.sign_headers_v2(SECRET, KID, VM.upper(), "post", "/v1/start", body, now=1700)
    message = f"1700\nPOST\n/v1/start\n{VM}\n".encode() + body
    assert headers == {
        "X-Relay-Timestamp": "1700",
        "X-Relay-Target": VM,
        "X-Relay-Key-Id": KID,
        "X-Relay-Signature": "v2=" + hmac.new(SECRET, message, hashlib.sha256).hexdigest(),
    }
    assert module.key_id(SECRET) == KID


@pytest.mark.parametrize("module", [relay_signing, app_signing], ids=["relay", "functions"])
def test_v2_verify_refuses_what_it_must(module):
    """Both verifiers, on what the app signs."""
    body = b"{}"
    keys = {KID: SECRET}
    headers = app_signing.sign_headers_v2(SECRET, KID, VM, "POST", "/v1/start", body, now=1000)
    assert module.verify_v2(keys, VM, headers, "POST", "/v1/start", body, now=1200).startswith(
        "v2="
    )
    assert module.verify_v2(keys, VM.upper(), headers, "POST", "/v1/start", body, now=1000)
    with pytest.raises(module.WrongTarget, match="signed for another VM"):
        module.verify_v2(keys, OTHER, headers, "POST", "/v1/start", body, now=1000)
    for_other = app_signing.sign_headers_v2(SECRET, KID, OTHER, "POST", "/v1/start", body, now=1000)
    with pytest.raises(module.WrongTarget):
        module.verify_v2(keys, VM, for_other, "POST", "/v1/start", body, now=1000)
    # Rewriting the target header breaks the HMAC.
    with pytest.raises(module.SignatureError, match="bad signature"):
        module.verify_v2(
            keys, VM, {**for_other, "X-Relay-Target": VM}, "POST", "/v1/start", body, now=1000
        )
    with pytest.raises(module.SignatureError, match="unknown key id"):
        module.verify_v2({"0" * 16: SECRET}, VM, headers, "POST", "/v1/start", body, now=1000)
    with pytest.raises(module.SignatureError, match="stale"):
        module.verify_v2(keys, VM, headers, "POST", "/v1/start", body, now=1301)
    with pytest.raises(module.SignatureError, match="bad signature"):
        module.verify_v2(keys, VM, headers, "POST", "/v1/hook", body, now=1000)
    with pytest.raises(module.SignatureError, match="bad signature"):
        module.verify_v2(keys, VM, headers, "POST", "/v1/start", b"{ }", now=1000)
    v1 = app_signing.sign_headers(SECRET, "POST", "/v1/start", body, now=1000)
    with pytest.raises(module.SignatureError, match="only v2"):
        module.verify_v2(keys, VM, {**headers, **v1}, "POST", "/v1/start", body, now=1000)
    with pytest.raises(module.MalformedSignature):
        module.verify_v2(
            keys,
            VM,
            {**headers, "X-Relay-Timestamp": "\uff11\uff12"},
            "POST",
            "/v1/start",
            body,
            now=1,
        )
    with pytest.raises(module.SignatureError, match="missing"):
        module.verify_v2(keys, VM, {}, "POST", "/v1/start", body, now=1000)


def test_the_relay_verifies_what_the_app_signs():
    """relay/signing.py (standard library, no hashlib on the hot path) accepts exactly what
    functions/signing.py signs, and names keys alike; it carries no signer of its own."""
    for body in (b"", b"{}", "é".encode() * 100):
        for now in (0, 1_700_000_000):
            args = (SECRET, KID, VM, "POST", "/v1/hook", body)
            headers = app_signing.sign_headers_v2(*args, now=now)
            given = relay_signing.verify_v2(
                {KID: SECRET}, VM, headers, "POST", "/v1/hook", body, now=now
            )
            assert given == headers["X-Relay-Signature"]
    assert relay_signing.key_id(SECRET) == app_signing.key_id(SECRET)
    assert not hasattr(relay_signing, "sign_headers_v2") and not hasattr(
        relay_signing, "sign_headers"
    )
