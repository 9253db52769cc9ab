// One scope where the function app may acknowledge Scheduled Events (eventgrid.bicep): a
// resource group, or one VM, scale set or availability set in it. Deployed in that group.

@description('Name (GUID) of the custom role holding only the acknowledge action.')
param roleDefinitionName string

@description('Principal (object) id of the function app\'s managed identity.')
param functionPrincipalId string

@description('\'\' (the whole resource group), virtualMachines, virtualMachineScaleSets or availabilitySets.')
@allowed([
  ''
  'virtualMachines'
  'virtualMachineScaleSets'
  'availabilitySets'
])
param resourceType string = ''

@description('The resource\'s name when resourceType is set.')
param resourceName string = ''

resource vm 'Microsoft.Compute/virtualMachines@2024-07-01' existing = if (resourceType == 'virtualMachines') {
  name: resourceName
}

resource scaleSet 'Microsoft.Compute/virtualMachineScaleSets@2024-07-01' existing = if (resourceType == 'virtualMachineScaleSets') {
  name: resourceName
}

resource availabilitySet 'Microsoft.Compute/availabilitySets@2024-07-01' existing = if (resourceType == 'availabilitySets') {
  name: resourceName
}

resource onVm 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (resourceType == 'virtualMachines') {
  scope: vm
  name: guid(vm.id, functionPrincipalId, roleDefinitionName)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDefinitionName)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource onScaleSet 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (resourceType == 'virtualMachineScaleSets') {
  scope: scaleSet
  name: guid(scaleSet.id, functionPrincipalId, roleDefinitionName)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDefinitionName)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource onAvailabilitySet 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (resourceType == 'availabilitySets') {
  scope: availabilitySet
  name: guid(availabilitySet.id, functionPrincipalId, roleDefinitionName)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDefinitionName)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource onGroup 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (resourceType == '') {
  name: guid(resourceGroup().id, functionPrincipalId, roleDefinitionName)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleDefinitionName)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}
