// Storage for the function app: the Flex Consumption deployment container, the host's own
// containers and the state tables. Shared keys are off: the app reaches everything with its
// managed identity (Flex deploys from the container with identity auth, and Flex has no
// Azure Files content share that would need a key).

@description('Storage account name: 3-24 lowercase letters and digits, globally unique.')
@minLength(3)
@maxLength(24)
param accountName string

param location string

param tags object = {}

@description('Replication. The tables hold operational state that the relays\' next documents rebuild; pick a geo-redundant SKU if you want it to survive a region loss.')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
])
param skuName string = 'Standard_LRS'

@description('Blob container the Flex Consumption plan deploys the app package from.')
param deploymentContainerName string = 'app-package'

@description('Prefix of the state tables (app setting STATE_TABLE_PREFIX).')
param tablePrefix string = 'sebridge'

@description('Principal (object) id of the function app\'s managed identity.')
param functionPrincipalId string

// Built-in role definitions.
var storageBlobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
var storageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'

// The Functions host keeps its locks (timer triggers) and keys here; created up front so a
// container-scoped role is enough and the identity never needs account-wide blob rights.
var hostContainerNames = [
  'azure-webjobs-hosts'
  'azure-webjobs-secrets'
]

var tableSuffixes = [
  'vms'
  'events'
  'audit'
  'rejected'
  'drains'
  'deliveries'
]

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  //checkov:skip=CKV_AZURE_43: the name is a parameter (3-24 characters, checked); main.bicep derives a valid lowercase name
  //checkov:skip=CKV_AZURE_35: Flex deploys (one deploy) and the host reach this account over its public endpoint; shared keys are off and only the app's identity holds data roles
  //checkov:skip=CKV_AZURE_59: see CKV_AZURE_35; closing the public endpoint needs private endpoints and DNS in the customer's network
  //checkov:skip=CKV_AZURE_206: replication is a cost choice exposed as the skuName parameter; the tables are rebuilt by the relays
  name: accountName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: skuName
  }
  properties: {
    accessTier: 'Hot'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    allowCrossTenantReplication: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: 'Allow'
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: {
        blob: {
          enabled: true
          keyType: 'Account'
        }
        table: {
          enabled: true
          keyType: 'Account'
        }
      }
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource hostContainers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [
  for name in hostContainerNames: {
    parent: blobService
    name: name
    properties: {
      publicAccess: 'None'
    }
  }
]

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource tables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [
  for suffix in tableSuffixes: {
    parent: tableService
    name: '${tablePrefix}${suffix}'
  }
]

// Flex Consumption reads (and `func publish` writes) the app package in this container only.
resource functionOwnsDeploymentContainer 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: deploymentContainer
  name: guid(deploymentContainer.id, functionPrincipalId, storageBlobDataOwner)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwner)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// The host's lock and key containers, each on its own.
resource functionUsesHostContainers 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (name, i) in hostContainerNames: {
    scope: hostContainers[i]
    name: guid(hostContainers[i].id, functionPrincipalId, storageBlobDataContributor)
    properties: {
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
      principalId: functionPrincipalId
      principalType: 'ServicePrincipal'
    }
  }
]

// The state tables. Table roles are granted on the account: it is this app's own account and
// holds nothing else, and a changed STATE_TABLE_PREFIX keeps working.
resource functionUsesTables 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: account
  name: guid(account.id, functionPrincipalId, storageTableDataContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributor)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output accountName string = account.name
output accountId string = account.id
output blobEndpoint string = account.properties.primaryEndpoints.blob
output deploymentContainerUrl string = '${account.properties.primaryEndpoints.blob}${deploymentContainerName}'
output tablePrefix string = tablePrefix
