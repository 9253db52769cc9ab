"""The relay's own callback secret (contract §4): made here, never shared, never fetched.

`STATE_DIR/callback-key.json` = `{"current": {"id", "secret", "created"}, "previous":
{...} | null}`: `secret` is 32 random bytes (os.urandom) as hex, `id` (KID) the first 16
hex characters of their SHA-256, `created` unix seconds. The file is 0600 and the state
directory 0700, both the relay's user's, so nothing else on the VM (hook scripts run as
another user) can read it. The key travels to the app inside every attested envelope
(`callback_key`); the app signs its callbacks with it (scheme v2).

Rotation: once the current key is older than `max_age` seconds a new one is made; the old
one stays valid as `previous` for PREVIOUS_GRACE seconds (24 h), long enough for every
callback signed before the app learnt the new key. A lost or unreadable file (reimage,
corruption) just means a new key, which the app learns from the next message.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from relay.logs import event
from relay.outbox import atomic_write
from relay.signing import hmac_sha256, key_id

log = logging.getLogger("relay.keys")

KEY_FILE = "callback-key.json"
PREVIOUS_GRACE = 24 * 3600
DEFAULT_MAX_AGE = 30 * 86400
PROOF_LABEL = b"key-proof/v1\n"  # the app's functions.identity.keys.PROOF_LABEL


class CallbackKey:
    __slots__ = ("created", "id", "secret")

    def __init__(self, secret: bytes, created: int) -> None:
        self.secret = secret
        self.id = key_id(secret)
        self.created = created

    @classmethod
    def new(cls, now: float) -> CallbackKey:
        return cls(os.urandom(32), int(now))

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "secret": self.secret.hex(), "created": self.created}

    @classmethod
    def from_dict(cls, data: object) -> CallbackKey:
        if not isinstance(data, dict):
            raise ValueError("a key must be an object")
        secret = bytes.fromhex(str(data["secret"]))
        created = data["created"]
        if len(secret) != 32 or isinstance(created, bool) or not isinstance(created, int):
            raise ValueError("a key needs 32 bytes of secret and an integer 'created'")
        key = cls(secret, created)
        if data.get("id") != key.id:
            raise ValueError("the key id does not match the secret")
        return key

    def wire(self, previous: CallbackKey | None = None) -> dict[str, str]:
        """`callback_key` of an envelope (contract §1). With the previous key, also its id
        (`prev`) and its proof that this key is its successor (`proof`): what lets the app
        tell the relay's rotation from a key any other process on the VM could send."""
        wire = {"id": self.id, "secret": self.secret.hex()}
        if previous:
            proof = hmac_sha256(previous.secret, PROOF_LABEL + self.id.encode())
            wire.update(prev=previous.id, proof=proof.hex())
        return wire


class KeyStore:
    """Thread-safe: the callback verifies with it while the sender and watcher read it."""

    def __init__(
        self,
        state_dir: Path,
        max_age: float = DEFAULT_MAX_AGE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = state_dir
        self.path = state_dir / KEY_FILE
        self.max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(state_dir, 0o700)  # the key lives here: nobody else may even look in
        self.current, self.previous = self._load()

    def _load(self) -> tuple[CallbackKey, CallbackKey | None]:
        try:
            data = json.loads(self.path.read_bytes())
            current = CallbackKey.from_dict(data["current"])
            previous = None
            if data.get("previous") is not None:
                previous = CallbackKey.from_dict(data["previous"])
        except FileNotFoundError:
            current, previous = self._make(None, "no callback key yet: made one")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as exc:
            # PermissionError and other OSErrors propagate: the relay cannot start safely.
            current, previous = self._make(
                None, "the callback key file is unreadable: made a new key", error=str(exc)
            )
        os.chmod(self.path, 0o600)
        return current, previous

    def _make(
        self, previous: CallbackKey | None, message: str, **fields: object
    ) -> tuple[CallbackKey, CallbackKey | None]:
        current = CallbackKey.new(self._clock())
        self._save(current, previous)
        event(log, logging.INFO, message, key_id=current.id, **fields)
        return current, previous

    def _save(self, current: CallbackKey, previous: CallbackKey | None) -> None:
        data = {"current": current.to_dict(), "previous": previous and previous.to_dict()}
        atomic_write(self.path, json.dumps(data).encode(), mode=0o600)

    def rotate_if_due(self) -> bool:
        """A new current key once the current one is `max_age` old; True if it rotated."""
        now = self._clock()
        with self._lock:
            if now - self.current.created < self.max_age:
                return False
            old = self.current
            try:
                self.current, self.previous = self._make(
                    old, "callback key rotated", previous_key_id=old.id
                )
            except OSError as exc:
                event(log, logging.ERROR, "cannot rotate the callback key", error=str(exc))
                return False
        return True

    def keys(self) -> dict[str, bytes]:
        """KID -> secret of the keys a callback may be signed with: the current one, and
        the previous one for PREVIOUS_GRACE seconds after the current one was made."""
        with self._lock:
            current, previous = self.current, self.previous
        keys = {current.id: current.secret}
        if previous is not None and self._clock() < current.created + PREVIOUS_GRACE:
            keys[previous.id] = previous.secret
        return keys

    def current_key(self) -> CallbackKey:
        with self._lock:
            return self.current

    def wire(self) -> dict[str, str]:
        """The envelope's `callback_key`: the current key, proved by the previous one."""
        with self._lock:
            return self.current.wire(self.previous)
