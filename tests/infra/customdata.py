"""How much of customData the relay's cloud-init leaves spare (bench and tests).

Azure decodes a VM's customData to at most 65,535 bytes. main.bicep fills
infra/relay/cloud-init.yaml with the embedded relay, add-relay.sh and ten arguments; the
longest values those arguments can take are used here (a 24-character storage account, a
63-character table name, the longest Service Bus namespace, and for the two free-form
parameters the @maxLength main.bicep gives them: a 256-character `relayPackageUrl` in the
release-URL form with its `#sha256=` suffix, a 64-character `relayHookAs`), so the spare
is a floor for any deployment (issue 44: it was measured with `embedded`). Issue 28 asks
for at least 8 KiB, room for the relay to grow.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

from tests.infra.bicep import INFRA

CUSTOM_DATA_LIMIT = 65535  # bytes once Azure decodes customData's base64 (ARM reference)
MIN_SPARE = 8192
PLACEHOLDER = re.compile(r"\{\{([A-Z0-9_]+)\}\}")
LONGEST = {
    # Namespaces are 6-50 characters; the FQDN adds .servicebus.windows.net.
    "SERVICEBUS_NAMESPACE": "n" * 50 + ".servicebus.windows.net",
    "DOCUMENTS_QUEUE": "q" * 50,
    "IDENTITY_CLIENT_ID": "00000000-0000-0000-0000-000000000000",
    "CALLBACK_PORT": "65535",
    "RELAY_KEY_SECRET_URI": "none",
    # https://HOST/PATH/scheduled-events-relay.pyz#sha256=HEX at relayPackageUrl's @maxLength.
    "RELAY_PACKAGE_URL": "https://"
    + "h" * (256 - 8 - 27 - 8 - 64)
    + "/scheduled-events-relay.pyz#sha256="
    + "0" * 64,
    "HEARTBEAT_TABLE_URL": "https://" + "s" * 24 + ".table.core.windows.net/" + "t" * 63,
    "RELAY_HOOKS": "none",
    "READY_PORT": "65535",
    # USER:GROUPS+CAPS at relayHookAs's @maxLength (64).
    "HOOK_AS": "www-data:docker,adm,systemd-journal,users+CAP_KILL,CAP_NET_ADMIN,CAP_CHOWN"[:64],
}


def custom_data(**values: str) -> str:
    """cloud-init.yaml as main.bicep fills it (the committed relay and script). The relay
    is embedded only when no `relayPackageUrl` is given (main.bicep `relayPyzB64`)."""
    relay = INFRA / "relay"
    filled = {
        **LONGEST,
        "ADD_RELAY_SCRIPT_B64": _b64(relay / "add-relay.sh.gz"),
        **values,
    }
    if "RELAY_PYZ_B64" not in values:
        embedded = not filled["RELAY_PACKAGE_URL"]
        filled["RELAY_PYZ_B64"] = _b64(relay / "scheduled-events-relay.pyz.xz") if embedded else ""
    text = (relay / "cloud-init.yaml").read_text()
    return PLACEHOLDER.sub(lambda m: filled[m.group(1)], text)


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def spare_bytes() -> int:
    """relay_customdata_spare_bytes: what a deployment's customData leaves unused, in the
    fuller of its two forms: the relay embedded (no package URL), or a package URL of the
    longest length main.bicep allows (no relay embedded)."""
    forms = (custom_data(RELAY_PACKAGE_URL=""), custom_data())
    return CUSTOM_DATA_LIMIT - max(len(form.encode()) for form in forms)
