"""Least privilege: each role scoped to one entity, to the right identity; built-in roles,
except the relays' heartbeat writer (storage.bicep) and the app's acknowledge role
(eventgrid.bicep), custom roles holding only the actions needed. The one grant on a whole
resource group is the app's Reader where the VMs live (vm-reader.bicep, contract §2),
besides Azure's own Maintenance resource provider's Scheduled Events Contributor there
(maintenance-provider.bicep, issue 32: Learn's agentless pages ask for it).

IDENTITY_GRANTS is the whole picture, as data: identity -> the exact set of (role, scope),
every assignment of every template; anything extra or missing fails."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.infra.bicep import (
    BUILTIN_ROLES,
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
# The app's Reader on each resource group of main.bicep's vmScopes (deployed in that group).
VM_READER_MODULE = "vm-reader"
# The Maintenance resource provider's Scheduled Events Contributor on the same groups and
# acknowledgeScopes' (Learn's Scheduled Events in Event Grid / Resource Graph pages).
MAINTENANCE_MODULE = "maintenance-provider"
# Modules deployed into other resource groups, whose grants are scoped to that group or to
# an existing resource there, not to an entity of this deployment.
OTHER_GROUP_MODULES = {ACKNOWLEDGE_MODULE, VM_READER_MODULE, MAINTENANCE_MODULE}

# Custom roles defined next to their assignments: `symbol.name` (or the parameter carrying
# it) -> a name for the tests.
HEARTBEAT_WRITER = "Relay Heartbeat Writer (custom)"
ACKNOWLEDGER = "Scheduled Events Acknowledge (custom)"
CUSTOM_ROLES = {"heartbeatWriterRole.name": HEARTBEAT_WRITER, "roleDefinitionName": ACKNOWLEDGER}

# Who is who: the principal each template's assignments name -> the identity.
IDENTITIES = {
    "relayPrincipalId": "relay",
    "functionPrincipalId": "function app",
    TOPIC_IDENTITY: "Event Grid system topic",
    "maintenanceProviderPrincipalId": "Maintenance resource provider",
}

SB_SENDER = "Azure Service Bus Data Sender"
SB_RECEIVER = "Azure Service Bus Data Receiver"
KV_SECRETS_USER = "Key Vault Secrets User"

# identity -> exactly the (role, scope) it holds, over all templates. A scope is
# "<module>: <resource type> <symbol>", or "<module>: resource group" for an unscoped grant
# (the group the module is deployed in).
IDENTITY_GRANTS: dict[str, set[tuple[str, str]]] = {
    "relay": {
        # Documents, and heartbeats from relays installed before the liveness table.
        (SB_SENDER, "servicebus: queues documents"),
        (SB_SENDER, "servicebus: queues heartbeats"),
        # Insert or merge in its own liveness table; nothing the app reads as truth, no
        # Key Vault role (no shared relay key any more).
        (HEARTBEAT_WRITER, "storage: tables livenessTable"),
    },
    "function app": {
        (SB_RECEIVER, "servicebus: queues documents"),
        # A document whose processing failed on an outage goes back to its queue,
        # scheduled for later (functions.triggers.later); the same for Event Grid's.
        (SB_SENDER, "servicebus: queues documents"),
        (SB_RECEIVER, "servicebus: queues heartbeats"),
        # Its own work queue of due events (functions.pipeline.workqueue): the sweep sends,
        # the `reconcile` function receives; no relay can send there.
        (SB_SENDER, "servicebus: queues reconcileQueue"),
        (SB_RECEIVER, "servicebus: queues reconcileQueue"),
        (SB_SENDER, "servicebus: topics notifications"),
        # On each channel subscription (Functions: a topic trigger's role must have effective
        # scope over the subscription; servicebus.bicep has the sources).
        (SB_RECEIVER, "servicebus: subscriptions channelSubscriptions"),
        (SB_RECEIVER, "eventgrid: queues eventQueue"),
        (SB_SENDER, "eventgrid: queues eventQueue"),
        # Host storage and the deployment container: the documented host role, on the
        # account (storage.bicep has the source).
        ("Storage Blob Data Owner", "storage: storageAccounts account"),
        ("Storage Table Data Contributor", "storage: storageAccounts account"),
        (KV_SECRETS_USER, "keyvault: secrets appSecretSecret"),
        (KV_SECRETS_USER, "keyvault: secrets pagerdutySecret"),
        (KV_SECRETS_USER, "keyvault: secrets teamsSecret"),
        (KV_SECRETS_USER, "keyvault: secrets slackSecret"),
        (KV_SECRETS_USER, "keyvault: secrets webhookUrlSecret"),
        (KV_SECRETS_USER, "keyvault: secrets webhookSecretSecret"),
        (KV_SECRETS_USER, "keyvault: secrets appSecretPreviousSecret"),
        (KV_SECRETS_USER, "keyvault: secrets webhookSecretPreviousSecret"),
        ("Monitoring Metrics Publisher", "monitoring: components appInsights"),
        # Resource Graph facts about a VM by its vmId, on each group of vmScopes.
        ("Reader", "vm-reader: resource group"),
        # Agentless mode, only where acknowledgeScopes names.
        (ACKNOWLEDGER, "eventgrid-acknowledge: virtualMachines vm"),
        (ACKNOWLEDGER, "eventgrid-acknowledge: virtualMachineScaleSets scaleSet"),
        (ACKNOWLEDGER, "eventgrid-acknowledge: availabilitySets availabilitySet"),
        (ACKNOWLEDGER, "eventgrid-acknowledge: resource group"),
    },
    "Maintenance resource provider": {
        ("Scheduled Events Contributor", "maintenance-provider: resource group"),
    },
    "Event Grid system topic": {
        (SB_SENDER, "eventgrid: queues eventQueue"),
        ("Storage Blob Data Contributor", "eventgrid: containers deadLetterContainer"),
    },
}
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


def _scope(template: Template, assignment: Resource) -> str:
    symbol = scope_symbol(assignment)
    if symbol is None:
        return f"{template.path.stem}: resource group"
    target = template.resource(symbol)
    return f"{template.path.stem}: {target.type.rsplit('/', 1)[-1]} {symbol}"


def _identity_grants() -> dict[str, set[tuple[str, str]]]:
    found: dict[str, set[tuple[str, str]]] = {}
    for template, assignment in _assignments():
        identity = IDENTITIES.get(_principal(assignment), _principal(assignment))
        role = _role_name(role_definition_guid(template, assignment))
        found.setdefault(identity, set()).add((role, _scope(template, assignment)))
    return found


def test_each_identity_holds_exactly_its_grants() -> None:
    found = _identity_grants()
    assert set(found) == set(IDENTITY_GRANTS), "an identity was added or lost"
    for identity, expected in IDENTITY_GRANTS.items():
        extra, missing = found[identity] - expected, expected - found[identity]
        assert not extra and not missing, f"{identity}: extra {extra}, missing {missing}"


def test_the_relays_hold_nothing_the_app_reads_as_truth_and_nothing_in_key_vault() -> None:
    relay = IDENTITY_GRANTS["relay"]
    assert not {scope for _, scope in relay if scope.startswith("keyvault:")}
    tables = {scope for _, scope in relay if scope.startswith("storage:")}
    assert tables == {"storage: tables livenessTable"}
    assert {role for role, _ in relay} == {SB_SENDER, HEARTBEAT_WRITER}


def test_there_are_role_assignments() -> None:
    assert len(_assignments()) >= 12


@pytest.mark.parametrize(
    ("template", "assignment"),
    [
        (t, a)
        for t, a in _assignments()
        if t.path.stem not in OTHER_GROUP_MODULES and _principal(a) != TOPIC_IDENTITY
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


def test_the_heartbeat_role_is_assigned_to_the_relays_on_the_liveness_table_only() -> None:
    st = load("storage")
    grants = [
        a
        for a in st.resources(ASSIGNMENT)
        if role_definition_guid(st, a) == "heartbeatWriterRole.name"
    ]
    (assignment,) = grants
    assert scope_symbol(assignment) == "livenessTable"
    table = st.resource("livenessTable")
    assert table.type == "Microsoft.Storage/storageAccounts/tableServices/tables"
    assert table.condition is None and table.loop is None
    assert table.body["name"] == "${tablePrefix}liveness"
    assert table.body["parent"] == "tableService"
    assert assignment.body["properties"]["principalId"] == "relayPrincipalId"
    assert assignment.condition is None
    # The app's own tables (the loop), vms and identities among them, are not the relays'.
    assert "liveness" not in st.variables["tableSuffixes"]
    assert set(st.variables["tableSuffixes"]) == {
        "vms",
        "identities",
        "events",
        "audit",
        "rejected",
        "drains",
        "deliveries",
    }
    (loop,) = [
        r
        for r in st.resources("Microsoft.Storage/storageAccounts/tableServices/tables")
        if r.loop is not None
    ]
    assert loop.body["name"] == "${tablePrefix}${suffix}"
    assert loop.loop["detail"]["array_name"] == "tableSuffixes"


def test_no_other_principal_gets_a_role() -> None:
    assert {g.principal for g in _grants()} == {
        "relayPrincipalId",
        "functionPrincipalId",
        TOPIC_IDENTITY,
        "maintenanceProviderPrincipalId",  # Azure's Maintenance RP: Learn asks for it
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
    assert dotted(kv.resource("appSecretSecret").body["name"]) == "names.appSecret"
    assert kv.variables["names"]["appSecret"] == "app-secret"
    assert not {n for n in kv.variables["names"] if "relay" in n.lower()}


def test_conditional_secret_grants_follow_their_secret() -> None:
    kv = load("keyvault")
    for assignment in kv.resources(ASSIGNMENT):
        target = kv.resource(scope_symbol(assignment))
        assert assignment.condition == target.condition, assignment.symbol
    assert kv.resource("appSecretSecret").condition is None


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


def test_the_reader_grant_is_the_built_in_reader_on_its_group_only() -> None:
    reader = load(VM_READER_MODULE)
    (assignment,) = reader.resources(ASSIGNMENT)
    assert role_definition_guid(reader, assignment) == BUILTIN_ROLES["Reader"]
    assert scope_symbol(assignment) is None  # the resource group the module is deployed in
    assert assignment.condition is None and assignment.loop is None
    props = assignment.body["properties"]
    assert props["principalId"] == "functionPrincipalId"
    assert props["principalType"] == "ServicePrincipal"
    name = assignment.body["name"]["function"]
    assert name["type"] == "guid"
    assert "functionPrincipalId" in name["parameters"].values()
    assert "reader" in name["parameters"].values()
    assert reader.resources("Microsoft.Authorization/roleDefinitions") == []
    assert set(reader.params) == {"functionPrincipalId"}


def test_main_deploys_a_reader_into_each_group_of_vm_scopes() -> None:
    main = load("main")
    module = main.modules["vmReaders"]
    assert module["detail"]["path"] == "modules/vm-reader.bicep"
    config = module["config"]
    assert config["loop_type"]["detail"]["array_name"] == "vmScopes"
    assert config["loop_type"]["detail"]["item_name"] == "scopeId"
    body = config["config"]
    # resourceGroup(SUB, RG) from /subscriptions/SUB/resourceGroups/RG.
    scope = body["scope"]["function"]
    assert scope["type"] == "resource_group"
    parts = [scope["parameters"][k] for k in ("subscription_id", "resource_group_name")]
    for part, index in zip(parts, (2, 4), strict=True):
        op = part["operator"]
        assert op["type"] == "index_accessor"
        assert op["operands"]["operand_1"]["function"] == {
            "type": "split",
            "parameters": {"input_string": "scopeId", "delimiter": "/"},
        }
        assert op["operands"]["operand_2"] == index
    assert dotted(body["params"]["functionPrincipalId"]) == (
        "functionIdentity.properties.principalId"
    )
    # Default: this deployment's resource group only.
    (default,) = main.param_default("vmScopes")
    assert default == {
        "operator": {
            "type": "property_accessor",
            "operands": {
                "operand_1": {
                    "function": {
                        "type": "resource_group",
                        "parameters": {"resource_group_name": None, "subscription_id": None},
                    }
                },
                "operand_2": "id",
            },
        }
    }
