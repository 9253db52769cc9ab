"""Issue 32 §2: the role assignments Azure's own documentation asks for, in the Bicep.

Sources (each read for issue 32; full list in docs/conformance.md):
- Maintenance resource provider: Learn "Scheduled Events in Event Grid" and "... in Azure
  Resource Graph", section "Role Based Access Control to View Scheduled Events":
  MicrosoftDocs/azure-compute-docs articles/virtual-machines/scheduled-events-event-grid.md
  @ e17cccca1c33b95eb16535a95cf6df28cbf0e7e5 and scheduled-events-resource-graph.md @
  cca79c525ab03d8aec5ddc010be3d73179a83eee ("assign it to Service identifier
  78315a30-673a-4a46-8e5c-ce59dbc6adf8 (MaintenanceResourceProvider)", role
  ScheduledEventContributor, at a subscription / resource group / resource).
- Service Bus topic trigger: MicrosoftDocs/azure-docs
  includes/functions-service-bus-permissions.md @ 1fa9d3b8bc41a9668b40bb78f66cdb74a87ea1b6
  ("needs to have effective scope over the Service Bus subscription resource. If only the
  topic is included, an error will occur"); Service Bus "Resource scope":
  articles/service-bus-messaging/service-bus-managed-service-identity.md @
  12aea13433e2b774e427341deb9a8ee25560a626 (queue, topic or subscription: "Role assignment
  applies to the specific Service Bus entity"; it does not say a topic's reaches its
  subscriptions, so each subscription gets its own).
- Host storage: MicrosoftDocs/azure-docs includes/functions-azurewebjobsstorage-permissions.md
  @ 85c6377a302cdce9b925c16320bdfd9e3e80debd (Storage Blob Data Owner "covers the basic
  needs of Functions host storage - ... the ability to create containers").
"""

from __future__ import annotations

from tests.infra.bicep import (
    BUILTIN_ROLES,
    INFRA,
    ROOT,
    load,
    parse_bicepparam,
    role_definition_guid,
    scope_symbol,
)
from tests.infra.bicep_evaluator import Evaluator

MAINTENANCE_APP_ID = "78315a30-673a-4a46-8e5c-ce59dbc6adf8"
ASSIGNMENT = "Microsoft.Authorization/roleAssignments"


def test_the_maintenance_provider_gets_scheduled_events_contributor_on_each_vm_group() -> None:
    module = load("maintenance-provider")
    (grant,) = module.resources(ASSIGNMENT)
    assert scope_symbol(grant) is None  # the resource group the module is deployed in
    guid = role_definition_guid(module, grant)
    assert guid == BUILTIN_ROLES["Scheduled Events Contributor"]
    assert grant.body["properties"]["principalId"] == "maintenanceProviderPrincipalId"
    assert grant.body["properties"]["principalType"] == "ServicePrincipal"

    main = load("main")
    assert main.param_default("maintenanceProviderPrincipalId") == ""
    call = main.modules["maintenanceProvider"]
    # Only with Event Grid on and an object id given; then on every group of vmScopes and of
    # acknowledgeScopes.
    assert (
        "assignMaintenanceProvider ? scheduledEventGroups : []"
        in (INFRA / "main.bicep").read_text()
    )
    assert call["config"]["loop_type"] is not None
    expression = main.tree["variables"]["scheduledEventGroups"]["value"]
    bound = {
        "vmScopes": ["/subscriptions/s/resourceGroups/rg-vms"],
        "acknowledgeScopes": [{"resourceGroup": "rg-web"}, {"resourceGroup": "rg-vms"}],
    }
    evaluated = Evaluator(main, bound).eval(expression)
    # vmScopes' group, then one per acknowledgeScopes entry (subscription().id is known only
    # in Azure: its id is built as `${subscription().id}/resourceGroups/${scope.resourceGroup}`).
    assert evaluated[0] == "/subscriptions/s/resourceGroups/rg-vms" and len(evaluated) == 3
    ids = main.tree["variables"]["acknowledgeGroupIds"]["value"]
    assert ids["loop_type"]["detail"]["array_name"] == "acknowledgeScopes"
    flag = main.tree["variables"]["assignMaintenanceProvider"]["value"]
    for enabled, principal, expected in [
        (True, "", False),
        (False, "0000", False),
        (True, "0000", True),
    ]:
        evaluator = Evaluator(
            main, {"enableEventGrid": enabled, "maintenanceProviderPrincipalId": principal}
        )
        assert evaluator.eval(flag) is expected


def test_an_unassigned_maintenance_role_is_said_with_the_exact_command() -> None:
    main = load("main")
    output = main.outputs["maintenanceProviderRole"]["value"]
    said = Evaluator(main, {"enableEventGrid": True, "maintenanceProviderPrincipalId": ""})
    text = said.eval(output)
    command = f"az ad sp show --id {MAINTENANCE_APP_ID} --query id -o tsv"
    assert text.startswith("NOT ASSIGNED") and command in text
    value = parse_bicepparam(INFRA / "main.bicepparam")["maintenanceProviderPrincipalId"]
    assert value["function"]["type"] == "readEnvironmentVariable"
    assert value["function"]["parameters"]["arg_1"] == "MAINTENANCE_RP_PRINCIPAL_ID"
    readme = (INFRA / "README.md").read_text()
    assert command in readme
    # The role's id confirmed by name before enabling (tests/infra/bicep.py: its source).
    assert 'az role definition list --name "Scheduled Events Contributor"' in readme


def test_topic_trigger_roles_are_on_each_subscription_not_the_topic() -> None:
    sb = load("servicebus")
    receivers = [
        a
        for a in sb.resources(ASSIGNMENT)
        if role_definition_guid(sb, a) == BUILTIN_ROLES["Azure Service Bus Data Receiver"]
        and a.body["properties"]["principalId"] == "functionPrincipalId"
    ]
    scopes = {scope_symbol(a) for a in receivers}
    assert "notifications" not in scopes
    assert "channelSubscriptions" in scopes
    (on_subscriptions,) = [a for a in receivers if scope_symbol(a) == "channelSubscriptions"]
    assert on_subscriptions.loop["detail"]["array_name"] == "subscriptionNames"


def test_host_storage_is_blob_data_owner_on_the_account() -> None:
    st = load("storage")
    blob_roles = {
        BUILTIN_ROLES["Storage Blob Data Owner"],
        BUILTIN_ROLES["Storage Blob Data Contributor"],
    }
    grants = [
        a
        for a in st.resources(ASSIGNMENT)
        if a.body["properties"]["principalId"] == "functionPrincipalId"
        and role_definition_guid(st, a) in blob_roles
    ]
    (grant,) = grants
    assert scope_symbol(grant) == "account"
    assert role_definition_guid(st, grant) == BUILTIN_ROLES["Storage Blob Data Owner"]


def test_conformance_names_the_roles_infra_uses() -> None:
    text = (ROOT / "docs" / "conformance.md").read_text()
    assert "Scheduled Events Acknowledge" in text  # the app's custom role
    assert MAINTENANCE_APP_ID in text and "Scheduled Events Contributor" in text


def test_the_agentless_path_is_said_to_be_preview_not_for_production() -> None:
    """Every version of Learn's Event Grid / Resource Graph pages read (e17cccca, 1d8378b2,
    cca79c52): "During the preview, we don't recommend using this delivery method for
    production workloads"."""
    for path in (ROOT / "README.md", INFRA / "README.md"):
        text = " ".join(path.read_text().split())
        assert "Preview, not for production" in text, path
        assert "production" in text and "preview" in text.lower()
    infra = " ".join((INFRA / "README.md").read_text().split())
    assert "ScheduledEventsActivity --namespace Microsoft.Maintenance" in infra
