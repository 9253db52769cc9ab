"""Callback keys: parsing the envelope's key, wrapping under APP_SECRET, derived keys."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from functions.identity.keys import (
    CallbackKey,
    InvalidCallbackKey,
    key_id_of,
    liveness_ok,
    liveness_signature,
    page_token_key,
    parse_callback_key,
    unwrap,
    wrap,
)

APP = b"A" * 40
SECRET = bytes(range(32))
KID = hashlib.sha256(SECRET).hexdigest()[:16]


def test_key_id_is_the_first_16_hex_of_the_secrets_sha256():
    assert key_id_of(SECRET) == KID and len(KID) == 16


def test_parse_accepts_a_matching_key_and_hides_the_secret_in_repr():
    key = parse_callback_key({"id": KID, "secret": SECRET.hex()})
    assert key == CallbackKey(KID, SECRET)
    assert SECRET.hex() not in repr(key)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "x",
        {"id": KID},
        {"secret": SECRET.hex()},
        {"id": KID.upper(), "secret": SECRET.hex()},
        {"id": KID, "secret": SECRET.hex().upper()},
        {"id": KID[:15], "secret": SECRET.hex()},
        {"id": KID, "secret": SECRET.hex()[:62]},
        {"id": "0" * 16, "secret": SECRET.hex()},  # an id that is not this secret's
        {"id": KID, "secret": 5},
    ],
)
def test_parse_refuses_malformed_or_mismatched_keys(value):
    with pytest.raises(InvalidCallbackKey):
        parse_callback_key(value)


def test_wrap_round_trips_and_is_randomised():
    key = CallbackKey(KID, SECRET)
    first, second = wrap(APP, key), wrap(APP, key)
    assert first != second
    assert unwrap(APP, first, KID) == key == unwrap(APP, second, KID)
    assert SECRET.hex() not in first


def test_unwrap_refuses_another_app_secret_another_id_and_tampering():
    key = CallbackKey(KID, SECRET)
    blob = wrap(APP, key)
    other = CallbackKey.generate()
    with pytest.raises(InvalidCallbackKey):
        unwrap(b"B" * 40, blob, KID)
    with pytest.raises(InvalidCallbackKey):
        unwrap(APP, blob, other.key_id)  # moved to another key's row
    raw = bytearray(base64.b64decode(blob))
    raw[-1] ^= 1
    with pytest.raises(InvalidCallbackKey):
        unwrap(APP, base64.b64encode(bytes(raw)).decode(), KID)
    for garbage in ("!!", "QUJD"):
        with pytest.raises(InvalidCallbackKey):
            unwrap(APP, garbage, KID)


def test_short_app_secret_is_refused():
    with pytest.raises(ValueError, match="at least 32"):
        wrap(b"short", CallbackKey(KID, SECRET))


def test_derived_keys_follow_the_contract_and_differ():
    assert page_token_key(APP) == hmac.new(APP, b"page-token/v1", hashlib.sha256).digest()
    assert page_token_key(APP) != hmac.new(APP, b"callback-key-wrap/v1", hashlib.sha256).digest()


def test_liveness_signature_is_the_contract_hmac():
    vm = "11111111-2222-3333-4444-555555555555"
    expected = hmac.new(
        SECRET, f"liveness/v1\n{vm}\n1700000000\n1.2.3".encode(), hashlib.sha256
    ).hexdigest()
    assert liveness_signature(SECRET, vm, 1700000000, "1.2.3") == expected
    assert liveness_ok(SECRET, vm, 1700000000, "1.2.3", expected)
    assert not liveness_ok(SECRET, vm, 1700000001, "1.2.3", expected)


def test_a_key_whose_id_does_not_match_cannot_be_built():
    with pytest.raises(InvalidCallbackKey):
        CallbackKey("0" * 16, SECRET)
