"""Callback keys: each relay's own secret, and the keys the app derives from APP_SECRET.

A relay makes its callback secret itself and sends it inside attested envelopes
(`callback_key: {"id", "secret"}`), so the app learns it bound to the VM Azure vouched for.
The app stores it wrapped (AES-256-GCM under a key derived from APP_SECRET, the key id as
associated data): a reader of the identities table learns nothing usable, and a wrapped
secret moved to another key id's row does not unwrap. Separate HMAC derivations keep each
use of APP_SECRET apart (wrapping, page tokens), so no output of one serves the other.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from functions.signing import key_id

WRAP_LABEL = b"callback-key-wrap/v1"
# A relay's proof that the key it sends succeeds its previous one (relay.keystore's label).
PROOF_LABEL = b"key-proof/v1\n"
PAGE_TOKEN_LABEL = b"page-token/v1"
NONCE_BYTES = 12
SECRET_BYTES = 32
_KEY_ID = re.compile(r"^[0-9a-f]{16}$")
_SECRET_HEX = re.compile(r"^[0-9a-f]{64}$")


class InvalidCallbackKey(ValueError):
    """A callback key that is malformed, does not match its id, or does not unwrap."""


@dataclass(frozen=True)
class CallbackKey:
    """A relay's callback secret (32 bytes) and its id (first 16 hex of its SHA-256)."""

    key_id: str
    secret: bytes

    def __post_init__(self) -> None:
        if len(self.secret) != SECRET_BYTES or key_id_of(self.secret) != self.key_id:
            raise InvalidCallbackKey("callback key id does not match its secret")

    def __repr__(self) -> str:  # never the secret in logs or tracebacks
        return f"CallbackKey(key_id={self.key_id!r})"

    @classmethod
    def generate(cls) -> CallbackKey:
        """A fresh key (tests and the local host; relays make their own)."""
        secret = os.urandom(SECRET_BYTES)
        return cls(key_id_of(secret), secret)


def key_id_of(secret: bytes) -> str:
    """KID = H(secret)[:16]: names a key without revealing it (the signing scheme's)."""
    return key_id(secret)


def parse_callback_key(value: Any) -> CallbackKey:
    """The envelope's `callback_key` object, validated: 16 lower-hex id, 64 lower-hex
    secret, and the id is the secret's (a relay cannot name one key and send another)."""
    if not isinstance(value, dict):
        raise InvalidCallbackKey("callback_key is not an object")
    key_id, secret = value.get("id"), value.get("secret")
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        raise InvalidCallbackKey("callback_key.id is not 16 lower-case hex characters")
    if not isinstance(secret, str) or not _SECRET_HEX.match(secret):
        raise InvalidCallbackKey("callback_key.secret is not 64 lower-case hex characters")
    return CallbackKey(key_id, bytes.fromhex(secret))


@dataclass(frozen=True)
class KeyProof:
    """The envelope's `callback_key.prev` and `.proof`: the relay's proof that whoever holds
    key `previous_id` made the key it sends, HMAC-SHA256(previous secret, PROOF_LABEL + new
    key id). Its key file is its user's alone (0600 in a 0700 directory), so no other
    process on the VM can make one: what tells the relay's own rotation from a key any
    local user could send with an attested document (functions.identity.registry)."""

    previous_id: str
    proof: str

    def __repr__(self) -> str:
        return f"KeyProof(previous_id={self.previous_id!r})"

    def made(self, previous: CallbackKey, key_id: str) -> bool:
        """Whether `previous` (the key named `previous_id`) made this proof for `key_id`."""
        return hmac.compare_digest(key_proof(previous.secret, key_id), self.proof)


def key_proof(secret: bytes, key_id: str) -> str:
    """The proof a relay holding `secret` sends with its next key `key_id` (hex)."""
    return hmac.new(secret, PROOF_LABEL + key_id.encode(), hashlib.sha256).hexdigest()


def parse_key_proof(value: Any) -> KeyProof | None:
    """The proof in the envelope's `callback_key` object, if it carries one (relays before
    it, and a relay that never rotated, send none): `prev` 16 lower-hex, `proof` 64."""
    if not isinstance(value, dict) or (value.get("prev") is None and value.get("proof") is None):
        return None
    previous_id, proof = value.get("prev"), value.get("proof")
    if not isinstance(previous_id, str) or not _KEY_ID.match(previous_id):
        raise InvalidCallbackKey("callback_key.prev is not 16 lower-case hex characters")
    if not isinstance(proof, str) or not _SECRET_HEX.match(proof):
        raise InvalidCallbackKey("callback_key.proof is not 64 lower-case hex characters")
    return KeyProof(previous_id, proof)


def _derive(app_secret: bytes, label: bytes) -> bytes:
    if len(app_secret) < 32:
        raise ValueError("APP_SECRET must be at least 32 bytes")
    return hmac.new(app_secret, label, hashlib.sha256).digest()


def wrap(app_secret: bytes, key: CallbackKey) -> str:
    """base64(nonce || AES-256-GCM(secret)), AAD = key id."""
    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(_derive(app_secret, WRAP_LABEL)).encrypt(nonce, key.secret, key.key_id.encode())
    return base64.b64encode(nonce + sealed).decode()


def unwrap(app_secret: bytes, blob: str, key_id: str) -> CallbackKey:
    """The key `wrap` sealed under `key_id`. The id is the GCM associated data: GCM cannot
    open without it, and the blob does not carry it (the registry stores it beside), so a
    blob copied under another id fails here instead of serving as that key."""
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidCallbackKey("wrapped key is not base64") from None
    if len(raw) != NONCE_BYTES + SECRET_BYTES + 16:
        raise InvalidCallbackKey("wrapped key has the wrong length")
    aead = AESGCM(_derive(app_secret, WRAP_LABEL))
    nonce, sealed = raw[:NONCE_BYTES], raw[NONCE_BYTES:]
    try:
        secret = aead.decrypt(nonce, sealed, key_id.encode())
    except InvalidTag:
        raise InvalidCallbackKey("wrapped key does not open (other APP_SECRET or id)") from None
    return CallbackKey(key_id, secret)


def page_token_key(app_secret: bytes) -> bytes:
    """The HMAC key of approval-page tokens: HMAC-SHA256(APP_SECRET, "page-token/v1")."""
    return _derive(app_secret, PAGE_TOKEN_LABEL)


def liveness_message(vm_id: str, at: int, relay_version: str) -> bytes:
    return f"liveness/v1\n{vm_id}\n{at}\n{relay_version}".encode()


def liveness_signature(secret: bytes, vm_id: str, at: int, relay_version: str) -> str:
    """The `sig` column of a liveness row (contract §5)."""
    return hmac.new(secret, liveness_message(vm_id, at, relay_version), hashlib.sha256).hexdigest()


def liveness_ok(secret: bytes, vm_id: str, at: int, relay_version: str, sig: str) -> bool:
    return hmac.compare_digest(liveness_signature(secret, vm_id, at, relay_version), sig)


def liveness_message_v2(
    vm_id: str, at: int, relay_version: str, contract: int, probe_at: int, drain: str
) -> bytes:
    """What a contract-2 relay signs (issue 44): the v1 fields and every column it added."""
    return f"liveness/v2\n{vm_id}\n{at}\n{relay_version}\n{contract}\n{probe_at}\n{drain}".encode()


def liveness_signature_v2(
    secret: bytes, vm_id: str, at: int, relay_version: str, contract: int, probe_at: int, drain: str
) -> str:
    """The `sig` column of a contract-2 liveness row (contract §5, liveness/v2)."""
    message = liveness_message_v2(vm_id, at, relay_version, contract, probe_at, drain)
    return hmac.new(secret, message, hashlib.sha256).hexdigest()
