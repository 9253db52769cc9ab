"""The other IMDS answers a relay needs: instance compute metadata and a managed-identity token.

The relay learns its name, scale set and resource id from `/metadata/instance/compute`, and
gets a Service Bus token from `/metadata/identity/oauth2/token`. Both are faked here with the
same shapes Azure returns, so the relay's code paths run unchanged against the simulator.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

SUBSCRIPTION_ID = "00000000-0000-0000-0000-000000000000"
RESOURCE_GROUP = "simulator-rg"

# Published instance-metadata versions (a superset is fine: the point is rejecting garbage).
INSTANCE_API_VERSIONS = frozenset(
    {
        "2017-03-01",
        "2017-04-02",
        "2017-08-01",
        "2017-10-01",
        "2017-12-01",
        "2018-02-01",
        "2018-04-02",
        "2018-10-01",
        "2019-02-01",
        "2019-03-11",
        "2019-04-30",
        "2019-06-01",
        "2019-06-04",
        "2019-08-01",
        "2019-08-15",
        "2019-11-01",
        "2020-06-01",
        "2020-07-15",
        "2020-09-01",
        "2020-10-01",
        "2020-12-01",
        "2021-01-01",
        "2021-02-01",
        "2021-03-01",
        "2021-05-01",
        "2021-08-01",
        "2021-10-01",
        "2021-11-01",
        "2021-11-15",
        "2021-12-13",
        "2023-07-01",
    }
)
# /metadata/attested/document (simulator.identity signs it; loaded only when asked).
ATTESTED_API_VERSIONS = frozenset(
    {"2018-10-01", "2019-03-11", "2020-09-01", "2021-02-01", "2023-07-01", "2025-04-07"}
)
MAX_NONCE_CHARS = 32
TOKEN_API_VERSIONS = frozenset({"2018-02-01", "2019-08-01", "2019-11-01", "2020-06-01"})
TOKEN_LIFETIME = 86399


def resource_id(vm: dict[str, Any]) -> str:
    base = (
        f"/subscriptions/{SUBSCRIPTION_ID}/resourceGroups/{RESOURCE_GROUP}"
        "/providers/Microsoft.Compute"
    )
    if vm["scale_set"]:
        instance = vm["name"].rsplit("_", 1)[-1]
        return f"{base}/virtualMachineScaleSets/{vm['scale_set']}/virtualMachines/{instance}"
    return f"{base}/virtualMachines/{vm['name']}"


def vm_id(vm: dict[str, Any]) -> str:
    """The VM's vmId: a stable UUID per name (lower-case, as IMDS writes it)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"relay-simulator/{vm['name']}"))


def attested(vm: dict[str, Any], nonce: str) -> dict[str, str]:
    """`/metadata/attested/document` for one VM: signed by the simulator's test issuer."""
    from simulator import identity  # cryptography: loaded only when a relay attests

    return identity.attested_document(vm_id(vm), SUBSCRIPTION_ID, nonce)


def compute(vm: dict[str, Any], location: str) -> dict[str, Any]:
    """`/metadata/instance/compute` for one simulated VM (`vm` from Simulator.describe_vm)."""
    vm_id_ = vm_id(vm)
    return {
        "azEnvironment": "AzurePublicCloud",
        "location": location,
        "name": vm["name"],
        "offer": "0001-com-ubuntu-server-jammy",
        "osType": "Linux",
        "placementGroupId": "",
        "platformFaultDomain": "0",
        "platformUpdateDomain": "0",
        "priority": "Spot" if vm["spot"] else "Regular",
        "provider": "Microsoft.Compute",
        "publisher": "Canonical",
        "resourceGroupName": RESOURCE_GROUP,
        "resourceId": resource_id(vm),
        "sku": "22_04-lts-gen2",
        "subscriptionId": SUBSCRIPTION_ID,
        "tags": "",
        "tagsList": [],
        "vmId": vm_id_,
        "vmScaleSetName": vm["scale_set"] or "",
        "vmSize": "Standard_D2s_v5",
        "zone": "",
    }


def token(vm: dict[str, Any], resource: str, now: float, client_id: str | None) -> dict[str, Any]:
    """A managed-identity token answer. The access token is an unsigned JWT-shaped string:
    nothing real can accept it, but code that peeks at `aud`/`exp` works."""
    expires_on = int(now) + TOKEN_LIFETIME
    client = client_id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"relay-simulator-mi/{vm['name']}"))

    def part(data: dict[str, Any]) -> str:
        raw = json.dumps(data, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    access_token = ".".join(
        (
            part({"alg": "none", "typ": "JWT"}),
            part(
                {
                    "aud": resource,
                    "exp": expires_on,
                    "iat": int(now),
                    "appid": client,
                    "xms_mirid": resource_id(vm),
                    "iss": "relay-simulator",
                }
            ),
            "simulated",
        )
    )
    return {
        "access_token": access_token,
        "client_id": client,
        "expires_in": str(TOKEN_LIFETIME),
        "expires_on": str(expires_on),
        "ext_expires_in": str(TOKEN_LIFETIME),
        "not_before": str(int(now)),
        "resource": resource,
        "token_type": "Bearer",
    }
