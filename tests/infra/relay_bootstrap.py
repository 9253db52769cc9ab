"""What the relay bootstrap's tests share (tests/infra/test_cloud_init.py, which tests
cloud-init and what main.bicep fills into it, and tests/infra/test_add_relay.py, which tests
infra/relay/add-relay.sh itself; tests/infra/test_enrolment.py and others use it too): the
files, the sample arguments the script is run with and their order, the template's
placeholders as main.bicep fills them, and the script's argument checks run alone.

A module rather than a conftest: nothing here is a fixture, and no other test changes.
"""

from __future__ import annotations

import base64
import re
import subprocess

from tests.infra.bicep import INFRA, load
from tests.infra.checkov_gate import SAMPLE

# What the script is tested with: the 5th argument is `none` now (it was the relay key's Key
# Vault secret URI; there is no shared key any more). An old caller's URI is only warned about.
ARGS = {**SAMPLE, "RELAY_KEY_SECRET_URI": "none"}

CLOUD_INIT = INFRA / "relay" / "cloud-init.yaml"
ADD_RELAY = INFRA / "relay" / "add-relay.sh"
ADD_RELAY_GZ = INFRA / "relay" / "add-relay.sh.gz"  # what customData carries (make relay)
PYZ_XZ = INFRA / "relay" / "scheduled-events-relay.pyz.xz"
DEPLOY_DIR = INFRA.parent / "relay" / "deploy"
UNIT = DEPLOY_DIR / "scheduled-events-relay.service"
PLACEHOLDER = re.compile(r"\{\{([A-Z0-9_]+)\}\}")
# The order add-relay.sh takes its arguments in.
ARG_ORDER = list(ARGS)


def replacements() -> dict[str, object]:
    """Placeholder -> what main.bicep puts there, following the chain of replace() vars."""
    main = load("main")
    found: dict[str, object] = {}
    name = "relayCloudInit"
    while name != "cloudInitTemplate":
        node = main.variables[name]["function"]
        assert node["type"] == "replace", name
        source, old, new = list(node["parameters"].values())[:3]
        key = PLACEHOLDER.fullmatch(old)
        assert key, f"{name} replaces {old!r}, not a placeholder"
        assert key.group(1) not in found
        found[key.group(1)] = new
        name = source
    return found


def render(**overrides: str) -> str:
    """cloud-init.yaml filled in with the sample arguments (and `overrides`) and the
    committed script and relay, as a deployment's customData."""
    values = dict(
        ARGS,
        ADD_RELAY_SCRIPT_B64=base64.b64encode(ADD_RELAY_GZ.read_bytes()).decode(),
        RELAY_PYZ_B64=base64.b64encode(PYZ_XZ.read_bytes()).decode(),
        **overrides,
    )
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], CLOUD_INIT.read_text())


def checked(*args: str) -> subprocess.CompletedProcess:
    """add-relay.sh up to its first side effect (the root check, then IMDS and installing),
    printing what it parsed instead: the argument checks alone, safe to run anywhere."""
    text = ADD_RELAY.read_text()
    cut = text.index('[ "$(id -u)" = 0 ]')
    script = text[:cut] + 'printf "%s|%s\\n" "$PACKAGE_URL" "$TABLE_URL"\nexit 0\n'
    return subprocess.run(
        ["sh", "-c", script, "add-relay.sh", *args], capture_output=True, text=True
    )
