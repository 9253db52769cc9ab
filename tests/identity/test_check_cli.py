"""`python -m functions attestation check` on the genuine documents: one JSON line, exit 0
when every check holds, the failing check and exit 1 otherwise, exit 2 for usage."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from functions.__main__ import main
from tests.identity.test_genuine import GENUINE, RETIRED, SAMPLES

G2 = next(s for s in SAMPLES if "g2" in s.file)
OLD = next(s for s in SAMPLES if s.retired)


@pytest.fixture(autouse=True)
def production_trust(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ATTESTATION_CA_PEM", "ALLOWED_SUBSCRIPTIONS", "ATTESTATION_SIGNER_SUFFIXES"):
        monkeypatch.delenv(name, raising=False)


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = main(["attestation", "check", *args, "--offline"])
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1]) if out else {}


def test_a_genuine_document_prints_what_azure_signed(capsys: pytest.CaptureFixture[str]) -> None:
    code, line = check(capsys, str(GENUINE / G2.file), "--at", G2.at.isoformat())
    assert code == 0
    assert line == {
        "ok": True,
        "vmId": G2.vm_id,
        "subscriptionId": G2.subscription,
        "createdOn": "2026-07-28T13:24:00+00:00",
        "expiresOn": "2026-07-28T19:24:00+00:00",
        "signer": list(G2.names),
        "chain": list(G2.chain),
    }


def test_a_retired_chain_fails_then_passes_with_ca_pem(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    at = OLD.at.isoformat()
    code, line = check(capsys, str(GENUINE / OLD.file), "--at", at)
    assert (code, line["ok"], line["check"]) == (1, False, "chain")
    bundle = tmp_path / "retired.pem"
    bundle.write_text("".join(p.read_text() for p in sorted(RETIRED.glob("*.pem"))))
    code, line = check(capsys, str(GENUINE / OLD.file), "--at", at, "--ca-pem", str(bundle))
    assert code == 0 and line["chain"] == list(OLD.chain)


@pytest.mark.parametrize(
    ("extra", "failed"),
    [(("--nonce", "1234567890"), "nonce"), (("--at", "2026-07-29T00:00:00+00:00"), "time")],
)
def test_a_failing_check_is_named(
    capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], failed: str
) -> None:
    args = [str(GENUINE / G2.file), "--at", G2.at.isoformat(), *extra]
    code, line = check(capsys, *args)
    assert code == 1 and line["check"] == failed and line["reason"].startswith("attestation:")


def test_the_subscription_allow_list_of_the_app_settings_applies(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALLOWED_SUBSCRIPTIONS", "00000000-0000-0000-0000-000000000000")
    code, line = check(capsys, str(GENUINE / G2.file), "--at", G2.at.isoformat())
    assert code == 1 and line["check"] == "subscription"


def test_the_nonce_and_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO((GENUINE / G2.file).read_text()))
    code, line = check(capsys, "-", "--at", G2.at.isoformat(), "--nonce", "20260728-192400")
    assert code == 0 and line["vmId"] == G2.vm_id


@pytest.mark.parametrize(
    "content", ["not json", "[]", '{"encoding": "base64", "signature": "x"}', '{"x": 1}']
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str
) -> None:
    path = tmp_path / "doc.json"
    path.write_text(content)
    assert main(["attestation", "check", str(path)]) == 2
    assert "attestation check:" in capsys.readouterr().err
    assert main(["attestation", "check", str(tmp_path / "missing.json")]) == 2
    assert main(["attestation", "check", str(GENUINE / G2.file), "--at", "yesterday"]) == 2


def test_it_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "functions", "attestation", "check", "--offline",
         str(GENUINE / G2.file), "--at", G2.at.isoformat()],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True


@pytest.mark.parametrize("sample", [s for s in SAMPLES if not s.retired], ids=lambda s: s.file)
def test_an_expired_document_is_reported_as_time_before_anything_is_fetched(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, sample
) -> None:
    """Without network, an expired genuine document used to come out as `unavailable` (its
    issuer could not be fetched): the cause an operator needs is that it expired, 6 h after
    IMDS made it (issue 33). Fetching is allowed here and must not happen."""
    from functions.identity import issuer_cache

    def no_fetch(*_args, **_kwargs):
        raise AssertionError("an issuer was fetched for an expired document")

    monkeypatch.setattr(issuer_cache.IssuerCache, "get", no_fetch)
    code = main(["attestation", "check", str(GENUINE / sample.file)])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (code, line["ok"], line["check"]) == (1, False, "time"), line
    assert "expired at" in line["reason"] and "6 h" in line["reason"]
    assert "--at " in line["reason"]


def test_ca_pem_takes_several_files_as_a_glob_gives_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/attestation.md shows `--ca-pem tests/identity/genuine/retired/*.pem`."""
    files = [str(p) for p in sorted(RETIRED.glob("*.pem"))]
    assert len(files) > 1
    code, line = check(
        capsys, str(GENUINE / OLD.file), "--at", OLD.at.isoformat(), "--ca-pem", *files
    )
    assert code == 0 and line["chain"] == list(OLD.chain)


def test_an_issuer_the_app_does_not_ship_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline, a document whose intermediate the app does not ship said cryptography's
    "candidates exhausted"; fetching, "retry later". Each now names the issuer, where Azure
    publishes it, and how to add it (issue 38)."""
    from functions.identity import issuer_cache, issuers

    args = [str(GENUINE / OLD.file), "--at", OLD.at.isoformat()]
    code, line = check(capsys, *args)  # --offline
    assert (code, line["check"]) == (1, "chain")
    assert "candidates exhausted" not in line["reason"]
    assert "'CN=Microsoft RSA TLS CA 01,O=Microsoft Corporation,C=US'" in line["reason"]
    assert "published at http://www.microsoft.com/pki/mscorp/" in line["reason"]

    def no_network(*_args, **_kwargs):
        raise issuers.IssuerUnavailable("www.microsoft.com: name resolution failed")

    monkeypatch.setattr(issuer_cache.IssuerCache, "get", no_network)
    code = main(["attestation", "check", *args])
    out = capsys.readouterr()
    line = json.loads(out.out.strip().splitlines()[-1])
    assert (code, line["check"]) == (1, "unavailable")
    assert "retry later" not in line["reason"] and "name resolution failed" in line["reason"]
    assert "CN=Microsoft RSA TLS CA 01" in line["reason"]
    assert "--ca-pem issuer.pem" in out.err


def test_a_forged_leaf_s_own_url_is_not_offered() -> None:
    """A caIssuers URL off Azure's issuer hosts is named as such, never offered as the
    place to fetch a certificate from (a forged document chooses it)."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import AuthorityInformationAccessOID, NameOID

    from functions.identity.attestation import issuer_words

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Microsoft RSA TLS CA 99")])
    url = "http://evil.example/Microsoft%20RSA%20TLS%20CA%2099.crt"
    aia = x509.AuthorityInformationAccess(
        [
            x509.AccessDescription(
                AuthorityInformationAccessOID.CA_ISSUERS, x509.UniformResourceIdentifier(url)
            )
        ]
    )
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(aia, critical=False)
        .sign(key, hashes.SHA256())
    )
    words = issuer_words(cert)
    assert "published at" not in words and "not one of Azure's issuer hosts" in words
