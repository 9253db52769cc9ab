"""What an attestation check can end in: refused (AttestationError, naming the rule it
broke) or not checkable now (AttestationUnavailable). Its own module so the PKCS#7 and
issuer-fetch helpers raise the same errors as the verifier without importing it;
functions.identity.attestation re-exports all three names."""

from __future__ import annotations

# The checks an AttestationError can name (its `check`).
CHECKS = (
    "format",  # not JSON / not PKCS#7 / no signature / missing fields
    "signature",  # digest or signature algorithm, signed attributes, RSA signature
    "signer_name",  # the signer certificate's DNS names are not Azure's attestation names
    "chain",  # the signer does not chain to a shipped (or configured) root
    "nonce",  # the signed nonce is not this message's
    "vm_id",  # the signed vmId is not the one the message claims
    "subscription",  # the signed subscription is not in the allow-list
    "time",  # createdOn in the future / expiresOn past / chain not valid now
)


class AttestationError(ValueError):
    """The message's attestation does not hold. The message is safe to record: it starts
    with "attestation: " and holds no secret (only ids, times and our own reasons).

    `check` names the check that failed, one of CHECKS, so a report-mode rollout and the
    operator's `attestation check` can say exactly which rule Azure's document broke."""

    def __init__(self, reason: str, check: str = "format") -> None:
        if check not in CHECKS:
            raise ValueError(f"unknown attestation check {check!r}")
        super().__init__(f"attestation: {reason}"[:1000])
        self.check = check


class AttestationUnavailable(RuntimeError):
    """The document could not be checked *now* (an unknown intermediate could not be
    fetched): the message must be retried, never rejected for good, because a genuine
    Terminate would otherwise be lost to a network blip."""
