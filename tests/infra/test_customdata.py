"""The embedded relay leaves customData room to grow (issue 28: at least 8 KiB spare)."""

from __future__ import annotations

import re

import yaml

from tests.infra.customdata import LONGEST, MIN_SPARE, PLACEHOLDER, custom_data, spare_bytes
from tests.infra.relay_bootstrap import CLOUD_INIT, replacements


def test_customdata_keeps_at_least_8_kib_spare() -> None:
    spare = spare_bytes()
    assert spare >= MIN_SPARE, (
        f"customData leaves {spare} bytes spare, under {MIN_SPARE}: slim the embedded relay "
        "(relay/deploy/build_pyz.py) or move something out of customData"
    )


def test_the_measure_fills_every_placeholder_main_bicep_fills() -> None:
    used = set(PLACEHOLDER.findall(CLOUD_INIT.read_text()))
    assert used == set(replacements())
    assert used == {*LONGEST, "RELAY_PYZ_B64", "ADD_RELAY_SCRIPT_B64"}
    doc = yaml.safe_load(custom_data())  # what cloud-init reads: still a valid document
    assert custom_data().startswith("#cloud-config\n") and doc["write_files"]


def test_a_longer_value_is_counted() -> None:
    shorter = custom_data(DOCUMENTS_QUEUE="q")
    assert len(custom_data().encode()) - len(shorter.encode()) == 49


def test_the_measure_uses_the_longest_value_bicep_allows() -> None:
    """Issue 44: the spare was measured with `relayPackageUrl` = `embedded`; with the
    release-URL form it was under the floor. Both free-form parameters have a @maxLength in
    main.bicep, and the measure fills them to it (the release URL with its #sha256=)."""
    from tests.infra.bicep import load

    params = load("main").params
    for param, placeholder in (
        ("relayPackageUrl", "RELAY_PACKAGE_URL"),
        ("relayHookAs", "HOOK_AS"),
    ):
        limits = [d["argument"] for d in params[param]["decorators"] if d["type"] == "max_length"]
        assert limits == [len(LONGEST[placeholder])], param
    url = LONGEST["RELAY_PACKAGE_URL"]
    assert url.startswith("https://") and re.fullmatch(r"[0-9a-f]{64}", url.split("#sha256=")[1])
    assert re.fullmatch(r"[a-z-]+(:[a-z,-]+)?(\+[A-Z_,]+)?", LONGEST["HOOK_AS"])


def test_a_package_url_deployment_carries_no_embedded_relay() -> None:
    """With relayPackageUrl the VM installs the release asset and never reads the embedded
    copy, so main.bicep embeds none (51 KB of customData freed); the spare is measured on
    the fuller form, the embedded relay."""
    with_url = yaml.safe_load(custom_data())
    embedded = yaml.safe_load(custom_data(RELAY_PACKAGE_URL=""))
    assert with_url["write_files"][0]["content"] == ""
    assert len(embedded["write_files"][0]["content"]) > 40_000
    assert spare_bytes() == 65535 - len(custom_data(RELAY_PACKAGE_URL="").encode())
