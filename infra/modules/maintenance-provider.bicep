// One resource group where VMs opted in to Scheduled Events in Event Grid / Resource Graph
// live (main.bicep: the groups of vmScopes and acknowledgeScopes). Learn's pages for that
// delivery have the Maintenance resource provider's service principal (application id
// 78315a30-673a-4a46-8e5c-ce59dbc6adf8, "MaintenanceResourceProvider") hold the built-in
// ScheduledEventContributor role "to read or acknowledge the scheduled events from a VM",
// at a subscription, resource group or resource (MicrosoftDocs/azure-compute-docs
// articles/virtual-machines/scheduled-events-event-grid.md @ e17cccca and
// scheduled-events-resource-graph.md @ cca79c52, "Role Based Access Control to View
// Scheduled Events"). Deployed in that group (a module scoped to it), like vm-reader.bicep.
//
// The principal's object id differs per tenant and Azure resource types cannot look an
// application id up (only the Microsoft Graph Bicep extension can, and reading a service
// principal through it needs the Graph permission Application.Read.All for the deploying
// identity): infra/README.md gives the `az ad sp show` command that prints it.

@description('Object id, in this tenant, of the service principal of application 78315a30-673a-4a46-8e5c-ce59dbc6adf8 (the Maintenance resource provider).')
param maintenanceProviderPrincipalId string

// Built-in role "Scheduled Events Contributor" (ScheduledEventContributor on Learn's pages):
// tests/infra/bicep.py BUILTIN_ROLES, with its source.
var scheduledEventsContributor = 'b67fe603-310e-4889-b9ee-8257d09d353d'

resource maintenanceProviderReadsEvents 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, maintenanceProviderPrincipalId, scheduledEventsContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', scheduledEventsContributor)
    principalId: maintenanceProviderPrincipalId
    principalType: 'ServicePrincipal'
  }
}
