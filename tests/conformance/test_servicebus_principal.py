"""Service Bus "Send Message" and App Service's client principal, held to outside sources.

- SAS tokens: the relay's own (standard library) token equals the one Microsoft's
  azure-servicebus SDK makes for the same resource, key and expiry (its
  `_pyamqp.utils.generate_sas_token`), and has the shape the REST page documents.
- Send Message: POST {namespace}/{queue}/messages with Authorization, a JSON
  BrokerProperties header and the body (Learn: "Send Message", REST API reference).
- X-MS-CLIENT-PRINCIPAL: base64 JSON {"auth_typ", "claims": [{"typ", "val"}], "name_typ",
  "role_typ"} (Learn: "Work with user identities in Azure App Service authentication"), and
  header names in any case (the page's note).
"""

from __future__ import annotations

import base64
import json
import urllib.parse

from azure.servicebus._pyamqp.utils import generate_sas_token

from functions.web.principal import read_principal
from relay.models import Envelope, VmRef
from relay.servicebus import SasTokenProvider, ServiceBusSender, sas_token
from tests.conformance.imds_server import serve

KEY = "c2VjcmV0LWtleS1mb3ItdGVzdHMtb25seS0wMDAwMDA="


def test_the_relays_sas_token_is_the_sdks() -> None:
    for uri in (
        "https://contoso.servicebus.windows.net/documents",
        "https://sb-x.servicebus.usgovcloudapi.net/heartbeats",
    ):
        ours = sas_token(uri, "relay-send", KEY, 1_900_000_000)
        theirs = generate_sas_token(uri, "relay-send", KEY, 1_900_000_000)
        assert ours == theirs


def test_the_token_has_the_documented_parts() -> None:
    token = sas_token("https://contoso.servicebus.windows.net/documents", "rule", KEY, 1)
    scheme, _, rest = token.partition(" ")
    assert scheme == "SharedAccessSignature"
    parts = dict(urllib.parse.parse_qsl(rest))
    assert set(parts) == {"sr", "sig", "se", "skn"}
    assert parts["sr"] == "https://contoso.servicebus.windows.net/documents"
    assert (parts["se"], parts["skn"]) == ("1", "rule")


def test_send_message_is_the_documented_request() -> None:
    vm = VmRef(name="vm1", vm_id="02aab8a4-74ef-476e-8182-f6d2ba4166a6")
    envelope = Envelope(kind="heartbeat", vm=vm, sequence=1, observed_at="2026-11-25T10:00:00Z")
    conn = (
        f"Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey={KEY}"
    )
    with serve({"/documents/messages": (201, {})}) as (url, answers):
        tokens = SasTokenProvider(conn, "https://contoso.servicebus.windows.net/documents")
        sender = ServiceBusSender(
            "contoso.servicebus.windows.net", "documents", tokens, 600, endpoint=url
        )
        sender.send(envelope, envelope.to_json())
    (seen,) = answers.seen
    assert (seen.method, seen.path) == ("POST", "/documents/messages")
    assert seen.headers["authorization"].startswith("SharedAccessSignature sr=")
    props = json.loads(seen.headers["brokerproperties"])
    assert props["MessageId"] == envelope.message_id() and props["TimeToLive"] == 600
    assert props["SessionId"] == vm.vm_id  # the documents queue requires sessions
    assert json.loads(seen.body) == json.loads(envelope.to_json())


def _header(principal: dict) -> str:
    return base64.b64encode(json.dumps(principal).encode()).decode()


def test_the_documented_principal_shape_is_read_whatever_the_header_case() -> None:
    principal = {
        "auth_typ": "aad",
        "claims": [
            {
                "typ": "http://schemas.microsoft.com/identity/claims/objectidentifier",
                "val": "oid-1",
            },
            {"typ": "name", "val": "Alice"},
            {"typ": "groups", "val": "group-a"},
            {"typ": "roles", "val": "Operator"},
        ],
        "name_typ": "name",
        "role_typ": "roles",
    }
    for name in ("X-MS-CLIENT-PRINCIPAL", "x-ms-client-principal", "X-Ms-Client-Principal"):
        read = read_principal({name: _header(principal)})
        assert read is not None
        assert read.groups == frozenset({"group-a"}) and "Operator" in read.roles
        assert read.admitted("group-a", None) and read.admitted(None, "Operator")
