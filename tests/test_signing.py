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
