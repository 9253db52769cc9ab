"""Attestation at send time (contract §1): every message proves which VM sent it.

Just before a message leaves, the sender puts the relay's current callback key in it
(`callback_key`), computes the binding nonce of the envelope without `attestation`
(N = sha256(canonical JSON)[:32], or a 10-digit form where IMDS does not take 32
characters), asks IMDS for the attested document of N and adds `attestation:
{"signature", "nonce"}`.
The app checks Azure's signature, that the signed nonce is the one of the body it got,
and that the signed vmId is `vm.vm_id`: a message cannot be replayed under another body,
nor sent in another VM's name.

Learn documents a 10-digit nonce; the REST spec allows 32 characters. IMDS may refuse the
long form (400), or answer 200 having signed another nonce (issue 32): the relay reads the
nonce Azure signed (relay.pkcs7: the JSON is plain bytes inside the PKCS#7) and, on a
400 or a mismatch, uses the 10-digit form from then on. A mismatch on the 10-digit form
too is a lasting failure (the message could never be admitted), said as such.

One attested call per send attempt, never cached across envelopes. A failure to attest is
a transient send failure: the message stays in the outbox and the send loop retries it
with backoff, like any other IMDS or Service Bus failure. Outbox entries written before an
upgrade (no vm_id, no key) are completed here from the running relay's identity.

A message too large for Service Bus once built (contract §8) is replaced by an attested
`unforwardable` envelope that says what could not be sent.
"""

from __future__ import annotations

import json
import logging

from relay.imds import ImdsClient, ImdsError
from relay.logs import event
from relay.models import parse_envelope
from relay.pkcs7 import signed_json
from relay.sendbase import Sender, SendError
from relay.signing import sha256

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from relay.keystore import KeyStore
    from relay.models import Envelope

log = logging.getLogger("relay.attest")

# Service Bus Standard: 256 KB per message, properties included; keep room for those.
MAX_MESSAGE_BYTES = 256 * 1000 - 8 * 1024


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def binding_nonces(envelope: dict[str, Any]) -> tuple[str, str]:
    """(32-hex form, 10-digit form) of the envelope without its `attestation` key."""
    h = sha256(canonical({k: v for k, v in envelope.items() if k != "attestation"})).hexdigest()
    return h[:32], f"{int(h[:15], 16) % 10**10:010d}"


class Attester:
    """Asks IMDS for attested documents; counts its calls (`calls`)."""

    def __init__(self, imds: ImdsClient, timeout: float | None = None) -> None:
        self.imds = imds
        self.timeout = timeout
        self.short_nonce = False  # IMDS refused or did not sign a 32-character nonce
        self.unreadable_logged = False
        self.calls = 0

    def attestation(self, envelope: dict[str, Any]) -> dict[str, str]:
        long_form, short_form = binding_nonces(envelope)
        nonce = short_form if self.short_nonce else long_form
        self.calls += 1
        try:
            answer = self.imds.get_attested(nonce, self.timeout)
        except ImdsError as exc:
            raise SendError("attestation", f"attested document: {exc}") from None
        if answer.status == 200:
            try:
                signature = json.loads(answer.body)["signature"]
                if not isinstance(signature, str) or not signature:
                    raise ValueError
            except (ValueError, KeyError, TypeError, RecursionError):
                raise SendError("attestation", "attested document: malformed answer") from None
            self._check_signed_nonce(signature, nonce)
            return {"signature": signature, "nonce": nonce}
        if answer.status == 400 and not self.short_nonce:
            # The REST spec allows 32 characters; Microsoft's page says 10 digits. Use the
            # documented form from now on; this message is retried at once.
            self._use_short_nonce(
                "IMDS refused a 32-character nonce; attesting with the 10-digit form",
                answer.text[:200],
            )
            raise SendError("attestation", "attested document: 400 to a 32-character nonce")
        retry_after = None
        value = answer.headers.get("retry-after", "")
        if value.isdigit():
            retry_after = float(value)
        transient = answer.status == 429 or answer.status >= 500
        raise SendError(
            f"attestation-http-{answer.status}",
            f"attested document: IMDS answered {answer.status}: {answer.text[:120]}",
            slow=not transient,
            retry_after=retry_after,
        )

    def _check_signed_nonce(self, signature: str, nonce: str) -> None:
        """Raise SendError when Azure signed another nonce than `nonce`: the app would
        refuse the message (its signed nonce must bind this body)."""
        content = signed_json(signature)
        signed = content.get("nonce") if content is not None else None
        if content is None:
            # Not readable here (the app's full parser judges): sent as it is, said once.
            if not self.unreadable_logged:
                self.unreadable_logged = True
                event(log, logging.WARNING, "cannot read the signed nonce of IMDS's answer")
            return
        if signed == nonce:
            return
        shown = str(signed)[:40]
        if not self.short_nonce:
            self._use_short_nonce(
                "IMDS signed another nonce than the 32-character one asked; attesting with "
                "the 10-digit form",
                f"asked {nonce}, signed {shown}",
            )
            raise SendError("attestation", f"attested document: IMDS signed nonce {shown!r}")
        raise SendError(
            "attestation-nonce-mismatch",
            f"attested document: IMDS signed nonce {shown!r}, not the 10-digit {nonce}",
            slow=True,
        )

    def _use_short_nonce(self, message: str, detail: str) -> None:
        self.short_nonce = True
        event(log, logging.WARNING, message, detail=detail)


class AttestingSender(Sender):
    """Completes, attests and size-checks each message, then hands it to `inner`."""

    def __init__(
        self,
        inner: Sender,
        attester: Attester,
        keys: KeyStore,
        vm: dict[str, Any] | None = None,
        max_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.inner = inner
        self.attester = attester
        self.keys = keys
        self.vm = vm  # the running relay's VmRef.to_dict(), set once it is known
        self.max_bytes = max_bytes

    def describe(self) -> str:
        return self.inner.describe()

    def prepare(self, body: str) -> dict[str, Any]:
        data = json.loads(body)
        data.pop("attestation", None)
        if self.vm is not None:
            vm = data.get("vm") if isinstance(data.get("vm"), dict) else {}
            if not vm.get("vm_id"):  # an outbox entry from before the upgrade
                data["vm"] = {**vm, "vm_id": self.vm.get("vm_id")}
        data["callback_key"] = self.keys.wire()
        return data

    def send(self, envelope: Envelope, body: str) -> None:
        data = self.prepare(body)
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        if len(text.encode()) + 12 * 1024 > self.max_bytes:  # attestation: a few KiB
            data = unforwardable(data, len(text.encode()), "too large for a Service Bus message")
            event(
                log,
                logging.ERROR,
                "a message is too large to forward; sending an unforwardable notice instead",
                sequence=data.get("sequence"),
                bytes=data["unforwardable"]["bytes"],
            )
        data["attestation"] = self.attester.attestation(data)
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        self.inner.send(parse_envelope(data), text)


def unforwardable(data: dict[str, Any], size: int, reason: str) -> dict[str, Any]:
    """The attested notice of contract §8 in place of an envelope that cannot be sent."""
    document = data.get("document")
    incarnation = document.get("DocumentIncarnation") if isinstance(document, dict) else None
    keep = ("schema", "vm", "relay_version", "sequence", "observed_at", "callback_key")
    notice = {k: data[k] for k in keep if k in data}
    notice.update(
        kind="unforwardable",
        document=None,
        unforwardable={"incarnation": incarnation, "bytes": size, "reason": reason},
    )
    return notice
