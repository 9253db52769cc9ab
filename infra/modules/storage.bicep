// Storage for the function app: the Flex Consumption deployment container, the host's own
// containers and the state tables. Shared keys are off: the app reaches everything with its
// managed identity (Flex deploys from the container with identity auth, and Flex has no
// Azure Files content share that would need a key). The relays write their heartbeats into
// a table of their own, `liveness`, with their own identity (Insert Or Merge Entity only,
// see below); they hold no right on any table the app reads as truth. The public endpoint
// stays on: relays need outbound HTTPS to <account>.table.core.windows.net, as they need it
// to the Service Bus namespace.

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

@description('Principal (object) id of the relays\' managed identity: may insert or merge entities in the liveness table, nothing else here.')
param relayPrincipalId string

// Built-in role definitions.
var storageBlobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
var storageTableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'

// The Functions host keeps its locks (timer triggers) and keys here (created up front; the
// host may create more: its role is on the account, below).
var hostContainerNames = [
  'azure-webjobs-hosts'
  'azure-webjobs-secrets'
]

// The app's own tables: only the function app's identity may read or write them. `vms`
// (VM rows) and `identities` (each VM's facts from Resource Graph and its wrapped callback
// keys, contract §2) are what the app believes; the app also creates `identities` itself.
// `liveness` is declared on its own below: it is the one table the relays may write to.
var tableSuffixes = [
  'vms'
  'identities'
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

// Relay heartbeats (contract §5): untrusted hints the app checks against each VM's own
// callback key; never read as truth.
resource livenessTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableService
  name: '${tablePrefix}liveness'
}

resource tables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [
  for suffix in tableSuffixes: {
    parent: tableService
    name: '${tablePrefix}${suffix}'
  }
]

// Host storage and the Flex deployment container: Storage Blob Data Owner on the account,
// the documented form. Functions' page for an identity-based AzureWebJobsStorage: "The
// Storage Blob Data Owner role covers the basic needs of Functions host storage - the
// runtime needs both read and write access to blobs and the ability to create containers"
// (MicrosoftDocs/azure-docs includes/functions-azurewebjobsstorage-permissions.md @
// 85c6377a); creating a container is an account-level action, so container-scoped roles
// (as before) leave the host unable to create one it needs. This account is the app's own:
// the only other container is Event Grid's dead letters (eventgrid.bicep), which the app
// may read anyway.
resource functionOwnsBlobs 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: account
  name: guid(account.id, functionPrincipalId, storageBlobDataOwner)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwner)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

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

// Relay heartbeats (contract §5): a relay installed with the table URL (add-relay.sh's 7th
// argument, RELAY_HEARTBEAT_TABLE) writes one row of its own in `liveness` per heartbeat,
// one Insert Or Merge Entity (PATCH, no If-Match) with the relay identity; it never reads or
// deletes. The app reads those rows as hints only: a row counts when its VM is enrolled and
// its signature (the VM's own callback key) holds. Relays installed without the table keep
// heartbeating on the Service Bus queue (servicebus.bicep keeps it and their role on it).
//
// The data actions, as confirmed: Microsoft's "Permissions for calling data operations"
// (learn.microsoft.com/rest/api/storageservices/authorize-with-azure-active-directory,
// 2025-03-27) gives Insert Or Merge Entity = entities/write OR (entities/add/action AND
// entities/update/action); the pair is taken. Both are among the five data actions of the
// built-in Storage Table Data Contributor (read, write, delete, add/action, update/action);
// read, delete and the broader write are left out. Not confirmed: the Insert Or Merge Entity
// page's own authorization section (not in the sources searched), and whether a custom role
// may name a single resource as its assignable scope (this one is assignable in this
// resource group, like the acknowledge role in eventgrid.bicep, and assigned on the table).
// What RBAC cannot narrow: the pair also allows Insert Entity, Merge Entity and Update
// Entity (replace), on any row and column of this one table. Every relay shares the
// identity, so one VM can write another VM's liveness row; the app then finds no valid
// signature on it and skips it (logged and counted), as the row is only a hint.
resource heartbeatWriterRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: guid(subscription().id, resourceGroup().id, 'relay-heartbeat-writer')
  properties: {
    roleName: 'Scheduled Events Relay Heartbeat Writer (${resourceGroup().name}, ${uniqueString(resourceGroup().id)})'
    description: 'Insert or merge table entities, nothing else (no read, no delete): the bridge\'s relays writing their heartbeats into the liveness table.'
    type: 'CustomRole'
    permissions: [
      {
        actions: []
        notActions: []
        dataActions: [
          'Microsoft.Storage/storageAccounts/tableServices/tables/entities/add/action'
          'Microsoft.Storage/storageAccounts/tableServices/tables/entities/update/action'
        ]
        notDataActions: []
      }
    ]
    assignableScopes: [
      resourceGroup().id
    ]
  }
}

// On the liveness table only. A deployment from before (the role on the vms table) leaves
// that assignment in place: delete it once (infra/README.md, "Upgrading to per-VM identity").
resource relayWritesHeartbeats 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: livenessTable
  name: guid(livenessTable.id, relayPrincipalId, heartbeatWriterRole.name)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', heartbeatWriterRole.name)
    principalId: relayPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output accountName string = account.name
output accountId string = account.id
output blobEndpoint string = account.properties.primaryEndpoints.blob
output deploymentContainerUrl string = '${account.properties.primaryEndpoints.blob}${deploymentContainerName}'
output tablePrefix string = tablePrefix
// What relays get as RELAY_HEARTBEAT_TABLE: https://<account>.table.core.windows.net/<prefix>liveness
// (the endpoint ends with a slash; other clouds have their own suffix).
output livenessTableUrl string = '${account.properties.primaryEndpoints.table}${livenessTable.name}'
