// One resource group where relayed VMs live (main.bicep's vmScopes): the function app's
// identity gets the built-in Reader role on it, so that Azure Resource Graph answers what the
// app asks about a VM by its vmId (name, resource group, scale set, availability set, the
// primary NIC's private IP: contract §2). Deployed in that group (a module scoped to it),
// because a resource-group deployment cannot assign roles in another group directly.
//
// Reader is control-plane read of every resource in the group (`*/read`: no data, no keys,
// no secrets; no action, no write). Resource Graph returns only what the caller may read,
// so these scopes are also where the app can find VMs at all.

@description('Principal (object) id of the function app\'s managed identity.')
param functionPrincipalId string

// Built-in role: Reader (tests/infra/bicep.py BUILTIN_ROLES, with its source).
var reader = 'acdd72a7-3385-48ef-bd42-f606fba81ae7'

resource functionReadsVms 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, functionPrincipalId, reader)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', reader)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}
