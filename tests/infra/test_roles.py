"""Least privilege: each role scoped to one entity, to the right identity; built-in roles,
except the relays' heartbeat writer (storage.bicep) and the app's acknowledge role
(eventgrid.bicep), custom roles holding only the actions needed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.infra.bicep import (
    ROLE_NAMES,
    Resource,
    Template,
    bicep_files,
    dotted,
    load,
    module_params,
    role_definition_guid,
    scope_symbol,
)

ASSIGNMENT = "Microsoft.Authorization/roleAssignments"

# The entity types a role may be scoped to. Never a resource group or a subscription, and
# never a whole Key Vault or Service Bus namespace.
ENTITY_TYPES = {
    "Microsoft.ServiceBus/namespaces/queues",
    "Microsoft.ServiceBus/namespaces/topics",
    "Microsoft.ServiceBus/namespaces/topics/subscriptions",
    "Microsoft.Storage/storageAccounts",
    "Microsoft.Storage/storageAccounts/blobServices/containers",
    "Microsoft.Storage/storageAccounts/tableServices/tables",
    "Microsoft.KeyVault/vaults/secrets",
    "Microsoft.Insights/components",
}


# Agentless mode (tests/infra/test_eventgrid.py checks these itself): the custom
# acknowledge role, assigned where the user names, and the Event Grid topic's own identity.
ACKNOWLEDGE_MODULE = "eventgrid-acknowledge"
TOPIC_IDENTITY = "systemTopic.identity.principalId"

# Custom roles defined next to their one assignment: `symbol.name` -> a name for the tests.
HEARTBEAT_WRITER = "Relay Heartbeat Writer (custom)"
CUSTOM_ROLES = {"heartbeatWriterRole.name": HEARTBEAT_WRITER}
TABLE_ENTITY = "Microsoft.Storage/storageAccounts/tableServices/tables/entities"
# Insert Or Merge Entity = entities/write OR (add/action AND update/action) (storage.bicep).
HEARTBEAT_DATA_ACTIONS = [f"{TABLE_ENTITY}/add/action", f"{TABLE_ENTITY}/update/action"]


def _principal(assignment: Resource) -> str:
    principal = assignment.body["properties"]["principalId"]
    return principal if isinstance(principal, str) else dotted(principal)


def _role_name(guid: str) -> str:
    return ROLE_NAMES.get(guid) or CUSTOM_ROLES.get(guid, "?")


@dataclass(frozen=True)
class Grant:
    module: str
    scope: str
    role: str
    principal: str


def _assignments() -> list[tuple[Template, Resource]]:
    found = []
    for path in bicep_files():
        template = Template.load(path)
        found.extend((template, a) for a in template.resources(ASSIGNMENT))
    return found


def _grants() -> set[Grant]:
    return {
        Grant(
            module=t.path.stem,
            scope=scope_symbol(a) or "",
            role=_role_name(role_definition_guid(t, a)),
            principal=_principal(a),
        )
        for t, a in _assignments()
        if t.path.stem != ACKNOWLEDGE_MODULE
    }


def test_there_are_role_assignments() -> None:
    assert len(_assignments()) >= 12


@pytest.mark.parametrize(
    ("template", "assignment"),
    [
        (t, a)
        for t, a in _assignments()
        if t.path.stem != ACKNOWLEDGE_MODULE and _principal(a) != TOPIC_IDENTITY
    ],
    ids=lambda x: getattr(x, "symbol", ""),
)
def test_assignment_is_builtin_entity_scoped_and_unique(template, assignment) -> None:
    guid = role_definition_guid(template, assignment)
    assert guid in ROLE_NAMES or guid in CUSTOM_ROLES, f"{assignment.symbol}: unknown role {guid}"
    scope = scope_symbol(assignment)
    assert scope, f"{assignment.symbol} has no scope: it would apply to the whole resource group"
    target = template.resource(scope)
    assert target.type in ENTITY_TYPES, f"{assignment.symbol} scoped to a {target.type}"
    props = assignment.body["properties"]
    assert props["principalType"] == "ServicePrincipal"
    assert props["principalId"] in template.params
    # The name (a GUID) covers scope, principal and role, so no two assignments collide.
    name = assignment.body["name"]["function"]
    assert name["type"] == "guid"
    args = list(name["parameters"].values())
    assert props["principalId"] in args
    role_arg = props["roleDefinitionId"]["function"]["parameters"]["resource_name_1"]
    assert role_arg in args


def test_the_relays_may_only_send_documents_and_heartbeats_and_read_the_relay_key() -> None:
    relay = {g for g in _grants() if g.principal == "relayPrincipalId"}
    assert relay == {
        Grant("servicebus", "documents", "Azure Service Bus Data Sender", "relayPrincipalId"),
        # Kept for relays installed without the heartbeat table (six bootstrap arguments).
        Grant("servicebus", "heartbeats", "Azure Service Bus Data Sender", "relayPrincipalId"),
        Grant("storage", "vmsTable", HEARTBEAT_WRITER, "relayPrincipalId"),
        Grant("keyvault", "relayKeySecret", "Key Vault Secrets User", "relayPrincipalId"),
    }


def _heartbeat_role() -> dict:
    st = load("storage")
    (role,) = st.resources("Microsoft.Authorization/roleDefinitions")
    assert role.symbol == "heartbeatWriterRole"
    assert role.condition is None and role.loop is None  # always there, one of it
    return role.body


def test_the_heartbeat_role_holds_insert_or_merge_and_nothing_else() -> None:
    props = _heartbeat_role()["properties"]
    assert props["type"] == "CustomRole"
    (permission,) = props["permissions"]
    assert permission["dataActions"] == HEARTBEAT_DATA_ACTIONS
    assert permission["actions"] == permission["notActions"] == []
    assert permission["notDataActions"] == []
    for action in permission["dataActions"]:
        assert "*" not in action
        assert not action.endswith(("/read", "/delete", "/write")), action
        assert action.startswith(f"{TABLE_ENTITY}/"), action  # entities, not tables or the account


def test_the_heartbeat_role_is_assignable_only_in_this_resource_group() -> None:
    role = _heartbeat_role()
    (scope,) = role["properties"]["assignableScopes"]
    accessor = scope["operator"]
    assert accessor["type"] == "property_accessor"
    assert accessor["operands"]["operand_1"]["function"]["type"] == "resource_group"
    assert accessor["operands"]["operand_1"]["function"]["parameters"] == {
        "resource_group_name": None,
        "subscription_id": None,
    }
    assert accessor["operands"]["operand_2"] == "id"
    # One definition per resource group, named after it (role names are unique per tenant).
    params = role["name"]["function"]["parameters"]
    assert params["extra_string_2"] == "relay-heartbeat-writer"
    assert "${resourceGroup().name}" in role["properties"]["roleName"]


def test_the_heartbeat_role_is_assigned_to_the_relays_on_the_vms_table_only() -> None:
    st = load("storage")
    grants = [
        a
        for a in st.resources(ASSIGNMENT)
        if role_definition_guid(st, a) == "heartbeatWriterRole.name"
    ]
    (assignment,) = grants
    assert scope_symbol(assignment) == "vmsTable"
    table = st.resource("vmsTable")
    assert table.type == "Microsoft.Storage/storageAccounts/tableServices/tables"
    assert table.condition is None and table.loop is None
    assert table.body["name"] == "${tablePrefix}vms"
    assert table.body["parent"] == "tableService"
    assert assignment.body["properties"]["principalId"] == "relayPrincipalId"
    assert assignment.condition is None
    # The app's own tables (the loop) are not the relays'.
    assert "vms" not in st.variables["tableSuffixes"]
    assert set(st.variables["tableSuffixes"]) == {
        "events",
        "audit",
        "rejected",
        "drains",
        "deliveries",
    }


def test_the_function_app_gets_exactly_what_it_uses() -> None:
    fn = {(g.module, g.scope, g.role) for g in _grants() if g.principal == "functionPrincipalId"}
    assert fn == {
        ("servicebus", "documents", "Azure Service Bus Data Receiver"),
        ("servicebus", "heartbeats", "Azure Service Bus Data Receiver"),
        ("servicebus", "notifications", "Azure Service Bus Data Sender"),
        ("servicebus", "notifications", "Azure Service Bus Data Receiver"),
        ("storage", "deploymentContainer", "Storage Blob Data Owner"),
        ("storage", "hostContainers", "Storage Blob Data Contributor"),
        ("storage", "account", "Storage Table Data Contributor"),
        ("keyvault", "relayKeySecret", "Key Vault Secrets User"),
        ("keyvault", "relayKeyPreviousSecret", "Key Vault Secrets User"),
        ("keyvault", "pagerdutySecret", "Key Vault Secrets User"),
        ("keyvault", "teamsSecret", "Key Vault Secrets User"),
        ("keyvault", "webhookUrlSecret", "Key Vault Secrets User"),
        ("keyvault", "webhookSecretSecret", "Key Vault Secrets User"),
        ("monitoring", "appInsights", "Monitoring Metrics Publisher"),
        ("eventgrid", "eventQueue", "Azure Service Bus Data Receiver"),
    }


def test_no_other_principal_gets_a_role() -> None:
    assert {g.principal for g in _grants()} == {
        "relayPrincipalId",
        "functionPrincipalId",
        TOPIC_IDENTITY,
    }


def test_scopes_are_the_named_entities() -> None:
    sb = load("servicebus")
    assert sb.resource("documents").type == "Microsoft.ServiceBus/namespaces/queues"
    assert sb.variables[sb.resource("documents").body["name"]] == "documents"
    assert sb.variables[sb.resource("notifications").body["name"]] == "notifications"
    st = load("storage")
    container = st.resource("deploymentContainer").body["name"]
    assert container == "deploymentContainerName"
    kv = load("keyvault")
    assert dotted(kv.resource("relayKeySecret").body["name"]) == "names.relayKey"
    assert kv.variables["names"]["relayKey"] == "relay-key"


def test_conditional_secret_grants_follow_their_secret() -> None:
    kv = load("keyvault")
    for assignment in kv.resources(ASSIGNMENT):
        target = kv.resource(scope_symbol(assignment))
        assert assignment.condition == target.condition, assignment.symbol
    assert kv.resource("relayKeySecret").condition is None


def test_main_wires_each_identity_to_its_own_principal_param() -> None:
    main = load("main")
    seen = set()
    for symbol in main.modules:
        params = module_params(main, symbol)
        for name, want in (
            ("relayPrincipalId", "relayIdentity.properties.principalId"),
            ("functionPrincipalId", "functionIdentity.properties.principalId"),
        ):
            if name in params:
                assert dotted(params[name]) == want, f"{symbol}.{name}"
                seen.add(name)
    assert seen == {"relayPrincipalId", "functionPrincipalId"}
    assert not main.resources(ASSIGNMENT), "main.bicep must not grant roles itself"


def test_identities_are_user_assigned_and_the_vms_use_the_relay_one() -> None:
    main = load("main")
    identities = {
        r.symbol for r in main.resources("Microsoft.ManagedIdentity/userAssignedIdentities")
    }
    assert identities == {"relayIdentity", "functionIdentity"}
    for symbol in ("exampleScaleSet", "exampleVm"):
        assert dotted(module_params(main, symbol)["relayIdentityId"]) == "relayIdentity.id"
    fn = module_params(main, "functionApp")
    assert dotted(fn["identityId"]) == "functionIdentity.id"
    assert dotted(fn["identityClientId"]) == "functionIdentity.properties.clientId"
