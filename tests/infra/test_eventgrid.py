"""Agentless mode in Bicep: the Event Grid topic and subscription, the queue they deliver
to, dead-lettering and retries, the opt-in on the example VMs, and least privilege for
acknowledging (a custom role with Scheduled Events Contributor's actions, only where the user
names)."""

from __future__ import annotations

import json

from functions.pipeline.sources.eventgrid import EVENT_TYPE, TOPIC_TYPE
from functions.settings import Settings
from tests.infra.bicep import (
    BUILTIN_ROLES,
    ROLE_NAMES,
    ROOT,
    dotted,
    load,
    module_params,
    role_definition_guid,
    scope_symbol,
)

EG = load("eventgrid")
ACK = load("eventgrid-acknowledge")
ASSIGNMENT = "Microsoft.Authorization/roleAssignments"
SCHEMAS = ROOT / "tests" / "infra" / "schemas"


def _props(symbol: str) -> dict:
    return EG.resource(symbol).body["properties"]


def test_system_topic_watches_the_subscription_for_maintenance_resources() -> None:
    topic = EG.resource("systemTopic")
    assert topic.type == "Microsoft.EventGrid/systemTopics"
    assert topic.body["location"] == "global"
    assert topic.body["identity"] == {"type": "SystemAssigned"}
    assert topic.body["properties"]["topicType"] == TOPIC_TYPE
    source = topic.body["properties"]["source"]["operator"]["operands"]
    assert source["operand_1"]["function"]["type"] == "subscription" and source["operand_2"] == "id"
    assert topic.condition == "enableEventGrid" and EG.param_default("enableEventGrid") is False


def test_subscription_filters_on_the_event_type_the_app_parses() -> None:
    sub = EG.resource("scheduledEvents")
    assert sub.type == "Microsoft.EventGrid/systemTopics/eventSubscriptions"
    assert sub.body["parent"] == "systemTopic"
    props = sub.body["properties"]
    (included,) = props["filter"]["includedEventTypes"]
    assert EG.variables[included] == EVENT_TYPE
    schemas = EG.decorator(props["eventDeliverySchema"], "allowed")
    assert set(schemas) == {"CloudEventSchemaV1_0", "EventGridSchema"}  # both parsed


def test_delivery_to_the_queue_with_the_topics_identity() -> None:
    delivery = _props("scheduledEvents")["deliveryWithResourceIdentity"]
    assert delivery["identity"] == {"type": "SystemAssigned"}
    assert delivery["destination"]["endpointType"] == "ServiceBusQueue"
    assert dotted(delivery["destination"]["properties"]["resourceId"]) == "eventQueue.id"
    queue = EG.resource("eventQueue").body
    assert queue["parent"] == "namespace" and queue["properties"]["requiresSession"] is False
    assert queue["properties"]["deadLetteringOnMessageExpiration"] is True
    assert EG.param_default(queue["name"]) == Settings().eventgrid_queue


def test_dead_letters_go_to_a_blob_container_and_retries_are_bounded() -> None:
    props = _props("scheduledEvents")
    dead = props["deadLetterWithResourceIdentity"]
    assert dead["identity"] == {"type": "SystemAssigned"}
    dest = dead["deadLetterDestination"]
    assert dest["endpointType"] == "StorageBlob"
    assert dotted(dest["properties"]["resourceId"]) == "account.id"
    assert dest["properties"]["blobContainerName"] == "deadLetterContainerName"
    container = EG.resource("deadLetterContainer")
    assert container.body["name"] == "deadLetterContainerName"
    assert container.body["properties"]["publicAccess"] == "None"
    retry = props["retryPolicy"]
    assert 1 <= EG.param_default(retry["maxDeliveryAttempts"]) <= 30
    assert 1 <= EG.param_default(retry["eventTimeToLiveInMinutes"]) <= 1440
    deps = set(EG.resource("scheduledEvents").body["dependsOn"])
    assert deps == {"topicSendsToQueue", "topicWritesDeadLetters"}  # roles before delivery


def test_the_topic_identity_may_send_to_that_queue_and_write_that_container_only() -> None:
    grants = {}
    for assignment in EG.resources(ASSIGNMENT):
        props = assignment.body["properties"]
        principal = props["principalId"]
        principal = principal if isinstance(principal, str) else dotted(principal)
        role = ROLE_NAMES[role_definition_guid(EG, assignment)]
        grants[assignment.symbol] = (principal, scope_symbol(assignment), role)
    assert grants == {
        "functionReceivesEvents": (
            "functionPrincipalId",
            "eventQueue",
            "Azure Service Bus Data Receiver",
        ),
        # The app sends a notification back, scheduled for later, when processing it
        # failed on an outage (functions.triggers.later); no relay can send here.
        "functionSendsEventsLater": (
            "functionPrincipalId",
            "eventQueue",
            "Azure Service Bus Data Sender",
        ),
        "topicSendsToQueue": (
            "systemTopic.identity.principalId",
            "eventQueue",
            "Azure Service Bus Data Sender",
        ),
        "topicWritesDeadLetters": (
            "systemTopic.identity.principalId",
            "deadLetterContainer",
            "Storage Blob Data Contributor",
        ),
    }


def test_custom_role_holds_what_the_built_in_scheduled_events_contributor_holds() -> None:
    """Issue 38: the custom role held the acknowledge action alone, where Azure's built-in
    Scheduled Events Contributor (the role Learn names "to read or acknowledge") also reads
    VMs, scale sets and availability sets; a group of acknowledgeScopes outside vmScopes
    (no Reader there) was then invisible to the app. Held to the definition as Azure returns
    it (schemas/scheduled-events-contributor.json, source inside): the same actions, no more."""
    builtin = json.loads((SCHEMAS / "scheduled-events-contributor.json").read_text())
    assert builtin["name"] == BUILTIN_ROLES["Scheduled Events Contributor"]
    (wanted,) = builtin["properties"]["permissions"]
    role = EG.resource("acknowledgeRole")
    assert role.type == "Microsoft.Authorization/roleDefinitions"
    assert role.condition["operator"]["type"] == "not"  # only when scopes are named
    (permission,) = role.body["properties"]["permissions"]
    actions = [EG.variables.get(a, a) for a in permission["actions"]]
    assert EG.variables[permission["actions"][0]] == wanted["actions"][0]
    # Azure compares actions case-insensitively; the same set, nothing added.
    assert sorted(a.lower() for a in actions) == sorted(a.lower() for a in wanted["actions"])
    assert permission["notActions"] == permission["dataActions"] == []
    assert permission["notDataActions"] == wanted["notDataActions"] == []
    assert role.body["properties"]["type"] == "CustomRole"
    # Assignable only in the resource groups the user named, and in the bridge's own group
    # where the definition is created (issue 32: it was left out). The form is the one of
    # Microsoft's resource-group role definition module, Azure/ResourceModules
    # modules/authorization/role-definition/resource-group/main.bicep @ 9edbecb8
    # (`assignableScopes: ... array(resourceGroup().id)`).
    assert role.body["properties"]["assignableScopes"] == "acknowledgeGroups"
    union = EG.variables["acknowledgeGroups"]["function"]
    assert union["type"] == "union" and union["parameters"]["arg_2"] == "namedGroups"
    (own,) = union["parameters"]["arg_1"]
    accessor = own["operator"]["operands"]
    assert accessor["operand_1"]["function"]["type"] == "resource_group"
    assert accessor["operand_2"] == "id"
    named = EG.tree["variables"]["namedGroups"]["value"]
    assert named["loop_type"]["detail"]["array_name"] == "acknowledgeScopes"
    assert EG.param_default("acknowledgeScopes") == []


def test_acknowledge_grants_go_only_where_the_user_names() -> None:
    module = EG.modules["acknowledgeGrants"]
    assert module["config"]["loop_type"]["detail"]["array_name"] == "acknowledgeScopes"
    params = module["config"]["config"]["params"]
    assert dotted(params["roleDefinitionName"]) == "acknowledgeRole.name"
    assert params["functionPrincipalId"] == "functionPrincipalId"
    scopes = {}
    for assignment in ACK.resources(ASSIGNMENT):
        assert role_definition_guid(ACK, assignment) == "roleDefinitionName"  # custom only
        assert assignment.body["properties"]["principalId"] == "functionPrincipalId"
        target = scope_symbol(assignment)
        kind = assignment.condition["operator"]["operands"]["operand_2"]
        scopes[kind] = ACK.resource(target).type if target else "resource group"
        if target:
            existing = ACK.resource(target)
            assert existing.existing and existing.condition == assignment.condition
    assert scopes == {
        "virtualMachines": "Microsoft.Compute/virtualMachines",
        "virtualMachineScaleSets": "Microsoft.Compute/virtualMachineScaleSets",
        "availabilitySets": "Microsoft.Compute/availabilitySets",
        "": "resource group",
    }
    assert set(ACK.decorator("resourceType", "allowed")) == set(scopes)


def test_main_wires_agentless_mode_and_nothing_on_the_vms_by_default() -> None:
    main = load("main")
    params = module_params(main, "eventGrid")
    assert dotted(params["functionPrincipalId"]) == "functionIdentity.properties.principalId"
    assert params["acknowledgeScopes"] == "acknowledgeScopes"
    assert main.param_default("acknowledgeScopes") == []
    assert main.param_default("enableEventGrid") is False
    fn = module_params(main, "functionApp")
    assert dotted(fn["eventGridQueueName"]) == "eventGrid.outputs.queueName"
    assert set(main.decorator("approvers", "allowed")) == {
        "",
        "relay,arm",
        "arm,relay",
        "arm",
        "relay",
    }
    assert fn["approvers"] == "effectiveApprovers"
    for symbol in ("exampleScaleSet", "exampleVm"):
        assert module_params(main, symbol)["eventGridOptIn"] == "exampleEventGridOptIn"
    assert main.param_default("exampleEventGridOptIn") is False


def test_function_app_reads_the_queue_and_approvers_settings() -> None:
    fn = load("functionapp")
    bridge = fn.variables["bridgeSettings"]
    assert bridge["EVENTGRID_QUEUE"] == "eventGridQueueName"
    assert bridge["APPROVERS"] == "approvers"
    assert Settings(approvers=fn.param_default("approvers")).approver_order == ("relay", "arm")


def test_example_vm_and_scale_set_opt_in_behind_a_parameter() -> None:
    for module, symbol in (("vm-relay", "vm"), ("vmss-relay", "scaleSet")):
        template = load(module)
        resource = template.tree["resources"][symbol]
        assert resource["api_version"] >= "2025-04-01", module  # the policy's first version
        policy = template.resource(symbol).body["properties"]["scheduledEventsPolicy"]
        operands = policy["operator"]["operands"]
        assert operands["condition"] == "eventGridOptIn" and operands["false_value"] is None
        target = template.variables[operands["true_value"]]
        grid = target["scheduledEventsAdditionalPublishingTargets"]["eventGridAndResourceGraph"]
        assert grid == {"enable": True, "scheduledEventsApiVersion": "2020-07-01"}
        assert template.param_default("eventGridOptIn") is False


def test_arm_approves_by_default_only_with_an_acknowledge_scope() -> None:
    """Issue #23: APPROVERS was relay,arm with no acknowledge role anywhere."""
    from tests.infra.bicep_evaluator import Evaluator

    main = load("main")
    expression = main.tree["variables"]["effectiveApprovers"]["value"]
    for approvers, scopes, expected in [
        ("", [], "relay"),
        ("", [{"resourceGroup": "rg-web"}], "relay,arm"),
        ("arm", [], "arm"),  # an explicit choice (a role granted out of band) is kept
        ("relay", [{"resourceGroup": "rg-web"}], "relay"),
    ]:
        evaluator = Evaluator(main, {"approvers": approvers, "acknowledgeScopes": scopes})
        assert evaluator.eval(expression) == expected
    assert main.param_default("approvers") == ""
