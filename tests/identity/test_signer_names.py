"""Which signer certificates are Azure's attestation signers: a DNS name that is exactly
metadata.azure.<com|us|cn> or a subdomain of it (no wildcard needed; a `*.` wildcard is
accepted as the subdomain form Microsoft's page shows), and nothing that merely contains
those words."""

from __future__ import annotations

import datetime as dt

import pytest

from functions.identity.attestation import (
    DEFAULT_SIGNER_SUFFIXES,
    AttestationError,
    AttestationVerifier,
    signer_name,
)
from simulator import identity as sim_identity


@pytest.mark.parametrize(
    ("names", "chosen"),
    [
        (("eastus.metadata.azure.com", "metadata.azure.com"), "metadata.azure.com"),
        (("southcentralus.metadata.azure.com",), "southcentralus.metadata.azure.com"),
        (("usgovvirginia.metadata.azure.us", "metadata.azure.us"), "metadata.azure.us"),
        (("chinanorth3.metadata.azure.cn",), "chinanorth3.metadata.azure.cn"),
        (("METADATA.AZURE.COM",), "metadata.azure.com"),
        (("*.metadata.azure.com",), "attest.metadata.azure.com"),
        (("a.b.metadata.azure.com",), "a.b.metadata.azure.com"),
    ],
)
def test_azures_names_are_accepted(names: tuple[str, ...], chosen: str) -> None:
    assert signer_name(names, DEFAULT_SIGNER_SUFFIXES) == chosen


@pytest.mark.parametrize(
    "names",
    [
        ("metadata.azure.com.evil.example",),
        ("xmetadata.azure.com",),
        ("evil.example",),
        ("metadata.microsoftazure.de",),
        ("*.*.metadata.azure.com",),
        ("a..metadata.azure.com",),
        ("a_b.metadata.azure.com",),
        (),
    ],
)
def test_other_names_are_refused(names: tuple[str, ...]) -> None:
    assert signer_name(names, DEFAULT_SIGNER_SUFFIXES) is None


@pytest.mark.parametrize(
    "dns",
    [
        ("eastus.metadata.azure.com", "metadata.azure.com"),
        ("metadata.azure.com",),
        ("westeurope.metadata.azure.com",),
        ("*.metadata.azure.com",),
        ("usgovvirginia.metadata.azure.us", "metadata.azure.us"),
    ],
)
def test_a_leaf_under_the_trusted_chain_verifies_for_each_form(dns: tuple[str, ...]) -> None:
    issuer = sim_identity.issuer_for("g2")
    leaf, key = sim_identity.make_leaf(issuer.intermediate, issuer.intermediate_key, dns)
    now = dt.datetime.now(dt.UTC)
    signature = sim_identity.sign(sim_identity.attested_content("vm", "s", "n", now=now), leaf, key)
    signed = AttestationVerifier(roots_pem=issuer.root_pem).inspect(signature, now)
    assert signed.signer_names == tuple(dns)


def test_a_suffix_not_configured_is_refused() -> None:
    issuer = sim_identity.issuer_for("g2")
    leaf, key = sim_identity.make_leaf(
        issuer.intermediate, issuer.intermediate_key, ("usgovvirginia.metadata.azure.us",)
    )
    now = dt.datetime.now(dt.UTC)
    signature = sim_identity.sign(sim_identity.attested_content("vm", "s", "n", now=now), leaf, key)
    public_only = AttestationVerifier(
        roots_pem=issuer.root_pem, signer_suffixes=("metadata.azure.com",)
    )
    with pytest.raises(AttestationError, match="not Azure's") as info:
        public_only.inspect(signature, now)
    assert info.value.check == "signer_name"
