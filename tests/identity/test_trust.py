"""The shipped trust material (functions/identity/trust): what the manifest says is what
the files are, every intermediate is signed by a certificate of the trust, the refresh
script parses what Microsoft serves, and expiry is announced months ahead."""

from __future__ import annotations

import datetime as dt
import hashlib
import warnings
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs7

from functions.identity import trust
from functions.identity.trust import refresh
from simulator import identity as sim_identity

WARN_DAYS = 183
RETIRED = Path(__file__).resolve().parent / "genuine" / "retired"
EXPECTED_ROOTS = {
    "DigiCert Global Root G2",
    "Microsoft RSA Root Certificate Authority 2017",
    "Microsoft TLS RSA Root G2",
}
EXPECTED_INTERMEDIATES = {
    *(f"Microsoft Azure RSA TLS Issuing CA {n}" for n in ("03", "04", "07", "08")),
    *(f"Microsoft TLS G2 RSA CA OCSP {n:02d}" for n in range(2, 17, 2)),
    "Microsoft TLS RSA Root G2",  # the cross-sign by DigiCert Global Root G2
}


def cn(cert: x509.Certificate) -> str:
    return refresh.common_name(cert.subject)


@pytest.mark.parametrize("folder", [trust.FOLDER, RETIRED], ids=["shipped", "retired"])
def test_every_listed_file_is_what_the_manifest_says(folder: Path) -> None:
    listed = trust.manifest(folder)["certificates"]
    assert {r["file"] for r in listed} == {p.name for p in folder.glob("*.pem")}
    for record in listed:
        cert = x509.load_pem_x509_certificate((folder / record["file"]).read_bytes())
        der = cert.public_bytes(serialization.Encoding.DER)
        assert hashlib.sha256(der).hexdigest() == record["sha256"]
        assert cert.subject.rfc4514_string() == record["subject"]
        assert cert.issuer.rfc4514_string() == record["issuer"]
        assert record["role"] == ("root" if cert.issuer == cert.subject else "intermediate")
        assert record["source"]  # where it came from, for the next reviewer
        assert dt.datetime.fromisoformat(record["not_after"]) == cert.not_valid_after_utc


def test_the_shipped_trust_holds_azures_roots_and_published_intermediates() -> None:
    material = trust.shipped()
    assert {cn(c) for c in material.roots} == EXPECTED_ROOTS
    assert {cn(c) for c in material.intermediates} == EXPECTED_INTERMEDIATES


def test_every_intermediate_is_signed_by_a_certificate_of_the_trust() -> None:
    material = trust.shipped()
    issuers = [*material.roots, *material.intermediates]
    for cert in material.intermediates:
        signers = [i for i in issuers if i.subject == cert.issuer and i is not cert]
        verified = []
        for signer in signers:
            try:
                cert.verify_directly_issued_by(signer)
                verified.append(signer)
            except Exception:  # noqa: S112 - another signer of the same name may hold
                continue
        assert verified, f"{cn(cert)} is not signed by any certificate of the trust"


def test_a_tampered_shipped_file_is_not_loaded(tmp_path: Path) -> None:
    for path in trust.FOLDER.glob("*.pem"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / "manifest.json").write_bytes((trust.FOLDER / "manifest.json").read_bytes())
    victim = next(tmp_path.glob("microsoft-tls-g2-rsa-ca-ocsp-02*.pem"))
    other = next(tmp_path.glob("microsoft-tls-g2-rsa-ca-ocsp-04*.pem"))
    victim.write_bytes(other.read_bytes())
    with pytest.raises(ValueError, match="fingerprint"):
        trust.load(tmp_path)


def test_shipped_certificates_expire_no_sooner_than_announced() -> None:
    """Warns (a pytest warning) half a year before a shipped certificate expires. It does
    not fail on the date: the date is Microsoft's, and a test that turns red on a calendar
    day is a time bomb for every later change. What must hold instead is that operators
    hear of it (`test_operators_are_told_half_a_year_ahead`) and that an expired
    certificate with a renewed copy (same subject and key) still leaves a valid chain."""
    now = dt.datetime.now(dt.UTC)
    material = trust.shipped()
    everything = [*material.roots, *material.intermediates]
    for file, not_after in refresh.expiring(trust.manifest(), now, WARN_DAYS):
        warnings.warn(
            f"shipped trust: {file} expires {not_after:%Y-%m-%d}: refresh it "
            "(docs/attestation.md, 'When shipped certificates near their end')",
            stacklevel=1,
        )
    for cert in everything:
        if cert.not_valid_after_utc > now:
            continue
        renewed = [
            c
            for c in everything
            if c.subject == cert.subject
            and c.public_key() == cert.public_key()
            and c.not_valid_after_utc > now
        ]
        if not renewed:
            warnings.warn(f"{cn(cert)} expired {cert.not_valid_after_utc:%Y-%m-%d}", stacklevel=1)
            assert "EXPIRED" in refresh.expiry_notice(trust.manifest(), now)


def test_operators_are_told_half_a_year_ahead() -> None:
    """The shipped manifest's first expiry, seen from fixed days around it: nothing a year
    ahead, a notice naming the date and the procedure from half a year ahead, and EXPIRED
    after it. `settings check` prints it as a notice (never an error under --strict) and
    the app logs it at start."""
    manifest = trust.manifest()
    first = min(dt.datetime.fromisoformat(r["not_after"]) for r in manifest["certificates"])
    assert refresh.expiry_notice(manifest, first - dt.timedelta(days=365)) == ""
    notice = refresh.expiry_notice(manifest, first - dt.timedelta(days=100))
    assert f"on {first:%Y-%m-%d}" in notice and "within 100 days" in notice
    assert "When shipped certificates near their end" in notice
    assert "EXPIRED" in refresh.expiry_notice(manifest, first + dt.timedelta(days=1))


def test_settings_check_prints_the_notice_and_stays_clean_under_strict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from functions import settings_check, settings_cli

    monkeypatch.setattr(settings_cli, "trust_notice", lambda: "4 certificate(s) expire soon")
    monkeypatch.setattr(settings_check, "trust_notice", lambda: "4 certificate(s) expire soon")
    monkeypatch.setenv("POLICY__DRY_RUN", "false")
    args = argparse.Namespace(file=None, local=True, strict=False)
    code = settings_cli.run_settings_check(args)
    err = capsys.readouterr().err
    assert "notice: trust: 4 certificate(s) expire soon" in err
    assert code in (0, 2)  # whatever the environment's settings say...
    assert "warning: trust" not in err  # ...the notice is never counted as a warning


def test_the_app_logs_the_notice_at_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from functions import settings_check

    monkeypatch.setattr(settings_check, "trust_notice", lambda: "4 certificate(s) expire soon")
    monkeypatch.setattr(
        settings_check,
        "check_settings",
        lambda **_: settings_check.SettingsReport((), settings_check.load_policy(), ()),
    )

    class _Settings:
        def with_policy(self, policy: object) -> object:
            return policy

    with caplog.at_level("WARNING"):
        settings_check.checked_settings(_Settings())  # type: ignore[arg-type]
    assert "trust: 4 certificate(s) expire soon" in caplog.text


def test_the_expiry_rule_warns_six_months_ahead(tmp_path: Path) -> None:
    soon = sim_identity.make_leaf(*sim_identity.make_root("Soon Root"), valid_days=30)[0]
    refresh.add(soon.public_bytes(serialization.Encoding.PEM), "test", tmp_path)
    now = dt.datetime.now(dt.UTC)
    assert [f for f, _ in refresh.expiring(refresh.read_manifest(tmp_path), now, WARN_DAYS)]
    assert not refresh.expiring(refresh.read_manifest(tmp_path), now, 10)


def test_refresh_reads_der_pem_and_pkcs7_and_writes_the_manifest(tmp_path: Path) -> None:
    root, root_key = sim_identity.make_root("Refresh Test Root")
    inter, _ = sim_identity.make_intermediate("Refresh Test CA 01", root, root_key)
    der = tmp_path / "inter.crt"
    der.write_bytes(inter.public_bytes(serialization.Encoding.DER))
    bag = tmp_path / "bag.p7b"
    bag.write_bytes(pkcs7.serialize_certificates([root, inter], serialization.Encoding.DER))
    folder = tmp_path / "trust"
    folder.mkdir()
    assert refresh.main(["--folder", str(folder), "--source", "a test", str(der)]) == 0
    assert refresh.main(["--folder", str(folder), "--source", "a bag", str(bag)]) == 0
    records = refresh.read_manifest(folder)["certificates"]
    assert [r["file"] for r in records] == [
        "refresh-test-root.pem",
        "refresh-test-ca-01--by-refresh-test-root.pem",
    ]
    assert records[1]["source"] == "a bag"  # the later add replaces the entry
    loaded = trust.load(folder)
    assert [cn(c) for c in loaded.roots] == ["Refresh Test Root"]
    assert [cn(c) for c in loaded.intermediates] == ["Refresh Test CA 01"]
    garbage = tmp_path / "garbage.crt"
    garbage.write_bytes(b"not a certificate")
    assert refresh.main(["--folder", str(folder), str(garbage)]) == 1


def test_from_pem_splits_roots_from_intermediates() -> None:
    issuer = sim_identity.issuer_for("g2")
    material = trust.from_pem(issuer.root_pem)
    assert {cn(c) for c in material.roots} == {
        "Simulated DigiCert Global Root G2",
        "Simulated Microsoft TLS RSA Root G2",
    }
    assert sorted(cn(c) for c in material.intermediates) == [
        "Simulated Microsoft TLS G2 RSA CA OCSP 02",
        "Simulated Microsoft TLS RSA Root G2",  # the cross-sign
    ]
    with pytest.raises(ValueError, match="no certificate"):
        trust.from_pem("nothing here")
