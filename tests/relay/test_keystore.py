"""The relay's proof of its key rotation (relay.keystore, issue 46 5a), as the app checks it."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

from functions.identity.keys import CallbackKey, parse_callback_key, parse_key_proof
from functions.model.envelope import CallbackKeyRef
from relay.keystore import KeyStore


def rotated(state: Path) -> KeyStore:
    keys = KeyStore(state, max_age=0)
    assert keys.rotate_if_due()
    return keys


def test_a_key_without_a_previous_one_carries_no_proof(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path)
    current = keys.current_key()
    assert keys.wire() == {"id": current.id, "secret": current.secret.hex()}


def test_a_rotated_key_carries_its_previous_keys_proof_which_the_app_verifies(
    tmp_path: Path,
) -> None:
    keys = rotated(tmp_path)
    wire = keys.wire()
    assert keys.previous is not None and wire["prev"] == keys.previous.id
    label = b"key-proof/v1\n" + keys.current.id.encode()
    assert wire["proof"] == hmac.new(keys.previous.secret, label, hashlib.sha256).hexdigest()
    # The app's model and parsers take it; the proof is the previous key's, for this key.
    CallbackKeyRef.model_validate(wire)
    key, proof = parse_callback_key(wire), parse_key_proof(wire)
    assert proof is not None and proof.previous_id == keys.previous.id
    previous = CallbackKey(keys.previous.id, keys.previous.secret)
    assert proof.made(previous, key.key_id)
    assert not proof.made(CallbackKey.generate(), key.key_id)  # another key's secret
    assert not proof.made(previous, CallbackKey.generate().key_id)  # for another key


def test_the_proof_survives_a_restart(tmp_path: Path) -> None:
    """The previous key is kept in the key file: a restarted relay proves its key too."""
    wire = rotated(tmp_path).wire()
    assert KeyStore(tmp_path).wire() == wire
    stored = json.loads((tmp_path / "callback-key.json").read_text())
    assert stored["previous"]["id"] == wire["prev"]
