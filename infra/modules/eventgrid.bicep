// Agentless mode (preview): Scheduled Events from Event Grid, approval through Resource Manager.
//
// Azure publishes `ScheduledEventEmitted` for VMs, scale sets and availability sets that
// opted in (scheduledEventsPolicy.scheduledEventsAdditionalPublishingTargets.
// eventGridAndResourceGraph) on a system topic of type
// Microsoft.ResourceNotifications.MaintenanceResources whose source is the subscription.
// One event subscription, filtered on that event type, delivers them with the topic's own
// managed identity to a queue of their own (no sessions: the documents queue requires a
// SessionId that Event Grid does not set, and notifications carry no per-VM order anyway).
// What cannot be delivered within the retry policy lands in a blob container (dead letter).
//
// The function app may acknowledge events only where you say (acknowledgeScopes), through
// a custom role holding what Azure's built-in "Scheduled Events Contributor" holds and no
// more: Microsoft.Maintenance/scheduledevents/acknowledge/action and read on the VMs, scale
// sets and availability sets it is assigned on (issue 38: with acknowledge alone, a group of
// acknowledgeScopes outside vmScopes was invisible to the app, to the acknowledge's own
// resource read and to Resource Graph's cross-check). A custom role rather than the built-in
// one: assignable only where you named. The built-in role is what Learn has the Maintenance
// resource provider's own service principal hold (main.bicep, modules/maintenance-provider.bicep).
//
// Preview, "not recommended for production" on every published version of Learn's pages.
// Features to register first (README): Microsoft.Compute/SendScheduledEventsPolicy and
// Microsoft.Maintenance/ScheduledEventsActivity (MicrosoftDocs/azure-compute-docs
// articles/virtual-machines/scheduled-events-event-grid.md @ 1d8378b2 names both).

@description('The bridge\'s Service Bus namespace (servicebus.bicep).')
param namespaceName string

@description('The storage account that keeps undeliverable notifications (storage.bicep).')
param storageAccountName string

param tags object = {}

@description('false: only the queue and the function app\'s receiver role exist (the app\'s trigger binds to it), no topic or subscription; set true once the preview features are registered.')
param enableEventGrid bool = false

@description('The queue Event Grid delivers to (app setting EVENTGRID_QUEUE).')
param queueName string = 'scheduled-events'

@description('System topic name. One MaintenanceResources topic per subscription: give an existing one\'s name to reuse it.')
param systemTopicName string = 'evgt-scheduled-events'

@allowed([
  'CloudEventSchemaV1_0'
  'EventGridSchema'
])
param eventDeliverySchema string = 'CloudEventSchemaV1_0'

@description('Event Grid delivery attempts before dead-lettering (1-30).')
@minValue(1)
@maxValue(30)
param maxDeliveryAttempts int = 30

@description('Minutes Event Grid keeps retrying a notification before dead-lettering it.')
@minValue(1)
@maxValue(1440)
param eventTimeToLiveInMinutes int = 1440

@description('Deliveries of a queue message to the app before the queue dead-letters it.')
@minValue(1)
@maxValue(100)
param maxDeliveryCount int = 10

param deadLetterContainerName string = 'eventgrid-deadletter'

@description('Principal (object) id of the function app\'s managed identity.')
param functionPrincipalId string

@description('Where the app may acknowledge events: [{resourceGroup: \'rg-web\'}] (every VM and set in it), or [{resourceGroup: \'rg-web\', resourceType: \'virtualMachineScaleSets\', name: \'vmss-web\'}] (one resource; also virtualMachines, availabilitySets). Empty: the app cannot acknowledge (relays approve).')
param acknowledgeScopes array = []

var eventType = 'Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted'
var acknowledgeAction = 'Microsoft.Maintenance/scheduledevents/acknowledge/action'

// Built-in role definitions.
var serviceBusDataSender = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
var serviceBusDataReceiver = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'

resource namespace 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' existing = {
  name: namespaceName
}

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: account
  name: 'default'
}

resource eventQueue 'Microsoft.ServiceBus/namespaces/queues@2022-10-01-preview' = {
  parent: namespace
  name: queueName
  properties: {
    requiresSession: false
    // Event Grid's own `id` is the duplicate key; the app drops repeats (a Table insert).
    requiresDuplicateDetection: false
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: true
    defaultMessageTimeToLive: 'P7D'
    lockDuration: 'PT10S' // as the documents queue: a redelivery soon after a crash (issue 31)
    maxSizeInMegabytes: 1024
    enablePartitioning: false
  }
}

resource deadLetterContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = if (enableEventGrid) {
  parent: blobService
  name: deadLetterContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource functionReceivesEvents 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: eventQueue
  name: guid(eventQueue.id, functionPrincipalId, serviceBusDataReceiver)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// The function app sends a notification back to this queue, scheduled for later, when
// processing it failed on an outage (functions.triggers.later); no relay can send here.
resource functionSendsEventsLater 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: eventQueue
  name: guid(eventQueue.id, functionPrincipalId, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource systemTopic 'Microsoft.EventGrid/systemTopics@2025-02-15' = if (enableEventGrid) {
  name: systemTopicName
  location: 'global'
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: subscription().id
    topicType: 'Microsoft.ResourceNotifications.MaintenanceResources'
  }
}

// The topic's identity may send to this queue and write dead letters to this container:
// nothing else.
resource topicSendsToQueue 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (enableEventGrid) {
  scope: eventQueue
  name: guid(eventQueue.id, systemTopicName, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: systemTopic.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

resource topicWritesDeadLetters 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (enableEventGrid) {
  scope: deadLetterContainer
  name: guid(deadLetterContainer.id, systemTopicName, storageBlobDataContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
    principalId: systemTopic.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

resource scheduledEvents 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = if (enableEventGrid) {
  parent: systemTopic
  name: 'scheduled-events-to-bridge'
  dependsOn: [
    topicSendsToQueue
    topicWritesDeadLetters
  ]
  properties: {
    eventDeliverySchema: eventDeliverySchema
    filter: {
      includedEventTypes: [
        eventType
      ]
    }
    deliveryWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      destination: {
        endpointType: 'ServiceBusQueue'
        properties: {
          resourceId: eventQueue.id
        }
      }
    }
    deadLetterWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      deadLetterDestination: {
        endpointType: 'StorageBlob'
        properties: {
          resourceId: account.id
          blobContainerName: deadLetterContainerName
        }
      }
    }
    retryPolicy: {
      maxDeliveryAttempts: maxDeliveryAttempts
      eventTimeToLiveInMinutes: eventTimeToLiveInMinutes
    }
  }
}

// The acknowledge action and the built-in role's reads, assignable only in the resource
// groups you named and in this one, where the definition is created: a role definition
// deployed in a resource group lists that group among its assignableScopes (Microsoft's own
// resource-group role definition module, Azure/ResourceModules modules/authorization/role-definition/
// resource-group/main.bicep @ 9edbecb8: `array(resourceGroup().id)`).
var namedGroups = [for scope in acknowledgeScopes: '${subscription().id}/resourceGroups/${scope.resourceGroup}']
var acknowledgeGroups = union([resourceGroup().id], namedGroups)

resource acknowledgeRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = if (!empty(acknowledgeScopes)) {
  name: guid(subscription().id, resourceGroup().id, 'scheduled-events-acknowledge')
  properties: {
    // Role names are unique in the tenant: the group's name alone collides with a group of the
    // same name in another subscription (RoleDefinitionWithSameNameExists).
    roleName: 'Scheduled Events Acknowledge (${resourceGroup().name}, ${uniqueString(resourceGroup().id)})'
    description: 'Approve (acknowledge) Scheduled Events and read the VMs, scale sets and availability sets they name (what Scheduled Events Contributor holds): the bridge\'s function app in agentless mode.'
    type: 'CustomRole'
    permissions: [
      {
        // Scheduled Events Contributor's actions (b67fe603-310e-4889-b9ee-8257d09d353d) as
        // Azure returns its definition: tests/infra/schemas/scheduled-events-contributor.json.
        actions: [
          acknowledgeAction
          'Microsoft.Compute/VirtualMachines/read'
          'Microsoft.Compute/VirtualMachineScaleSets/read'
          'Microsoft.Compute/AvailabilitySets/read'
        ]
        notActions: []
        dataActions: []
        notDataActions: []
      }
    ]
    assignableScopes: acknowledgeGroups
  }
}

module acknowledgeGrants 'eventgrid-acknowledge.bicep' = [
  for (scope, i) in acknowledgeScopes: {
    name: 'ack-${i}-${uniqueString(string(scope))}'
    scope: resourceGroup(scope.resourceGroup)
    params: {
      roleDefinitionName: acknowledgeRole.name
      functionPrincipalId: functionPrincipalId
      resourceType: contains(scope, 'resourceType') ? scope.resourceType : ''
      resourceName: contains(scope, 'name') ? scope.name : ''
    }
  }
]

output queueName string = eventQueue.name
output systemTopicName string = enableEventGrid ? systemTopic.name : ''
output acknowledgeRoleId string = !empty(acknowledgeScopes) ? acknowledgeRole.id : ''
