// Service Bus: the `documents` queue (relays -> ingest, one session per VM), the
// `heartbeats` queue (relays -> the batch trigger, no sessions) and the `notifications`
// topic (ingest -> one subscription per channel), with every role assignment scoped to the
// entity it is about: the relays' identity can only send to `documents` and `heartbeats`.
// Relays installed with the heartbeat table (add-relay.sh's 7th argument) write their
// heartbeats to the app's `vms` table instead (storage.bicep); `heartbeats` and the relays'
// sender role on it stay for relays installed before that, which send heartbeats here.

@description('Service Bus namespace name (globally unique).')
param namespaceName string

param location string

param tags object = {}

@description('Standard is enough for sessions and duplicate detection; Premium adds isolation and private networking.')
@allowed([
  'Standard'
  'Premium'
])
param sku string = 'Standard'

@description('Allow SAS (shared key) auth. Off: every client uses Entra ID through a managed identity.')
param allowSasAuth bool = false

@description('How long Service Bus remembers a MessageId to drop a relay\'s resend (at least 10 minutes).')
@allowed([
  'PT10M'
  'PT30M'
  'PT1H'
  'PT6H'
  'P1D'
])
param duplicateDetectionWindow string = 'PT1H'

@description('Deliveries before a message goes to the dead-letter queue.')
@minValue(1)
@maxValue(100)
param maxDeliveryCount int = 10

// How soon a message whose host died is delivered again (issue 31). The Functions host
// renews the lock of a message it is still processing (host.json
// maxAutoLockRenewalDuration), so a short lock costs a few renewals, never a redelivery of
// work in progress; it bounds recovery after a crash (docs/operations.md), and lets a
// Preempt's 30 s notice survive one. Service Bus allows 5 s at least.
param lockDuration string = 'PT10S'

// The heartbeats trigger takes messages in batches (host.json minMessageBatchSize, waiting up
// to maxBatchWaitTime, 30 s, to fill one). Learn's Service Bus host.json reference: "The
// longest allowed wait time is 50% of the entity message lock duration", and
// maxAutoLockRenewalDuration "only applies for functions that receive a single message at a
// time": a batch's locks are never renewed. On the 10 s lock above, a quiet period's batch
// lost its locks while it waited and was delivered again (then dead-lettered after
// maxDeliveryCount). So this queue has its own lock: twice the wait. A heartbeat is a hint,
// so the slower redelivery after a crash costs nothing.
@description('Lock of the heartbeats queue: at least twice host.json maxBatchWaitTime (Learn: the wait may be at most 50 % of the lock; batches are never renewed).')
param heartbeatLockDuration string = 'PT1M'

@description('How long an undelivered document is kept (ISO 8601); then it is dead-lettered, not dropped.')
param documentTimeToLive string = 'P7D'

@description('How long an undelivered heartbeat is kept (ISO 8601). A heartbeat older than the silence threshold says nothing, so an expired one is dropped, not dead-lettered.')
param heartbeatTimeToLive string = 'PT15M'

@description('How long an undelivered notification is kept (ISO 8601); then it is dead-lettered.')
param notificationTimeToLive string = 'P1D'

@description('Time to live of a work item on the reconcile queue (the sweep finds the event again after it).')
param reconcileTimeToLive string = 'PT1H'

@description('Name of the work queue of due events (functions.pipeline.workqueue).')
param reconcileQueueName string = 'reconcile'

@description('Principal (object) id of the relays\' managed identity: may send to `documents`, nothing else.')
param relayPrincipalId string

@description('Principal (object) id of the function app\'s managed identity.')
param functionPrincipalId string

var queueName = 'documents'
var heartbeatsQueueName = 'heartbeats'
var topicName = 'notifications'
var subscriptionNames = [
  'teams'
  'pagerduty'
  'webhook'
  'slack'
  'terminate'
]

// Built-in role definitions (https://learn.microsoft.com/azure/role-based-access-control/built-in-roles).
var serviceBusDataSender = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
var serviceBusDataReceiver = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'

// Public endpoint on purpose: relays on VMs anywhere send over HTTPS with Entra tokens, and
// private endpoints need Premium plus a DNS design in the customer's network.
resource namespace 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' = {
  name: namespaceName
  location: location
  tags: tags
  sku: {
    name: sku
    tier: sku
    capacity: sku == 'Premium' ? 1 : null
  }
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    disableLocalAuth: !allowSasAuth
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

resource documents 'Microsoft.ServiceBus/namespaces/queues@2022-10-01-preview' = {
  parent: namespace
  name: queueName
  properties: {
    requiresSession: true
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: true
    defaultMessageTimeToLive: documentTimeToLive
    lockDuration: lockDuration
    maxSizeInMegabytes: 1024
    enablePartitioning: false
  }
}

// Heartbeats only say "this relay is alive": no sessions (ordering does not matter, and a
// session per VM is what capped the documents queue), no duplicate detection (recording
// liveness twice is harmless), delivered in batches to one execution (host.json).
resource heartbeats 'Microsoft.ServiceBus/namespaces/queues@2022-10-01-preview' = {
  parent: namespace
  name: heartbeatsQueueName
  properties: {
    requiresSession: false
    requiresDuplicateDetection: false
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: false
    defaultMessageTimeToLive: heartbeatTimeToLive
    lockDuration: heartbeatLockDuration
    maxSizeInMegabytes: 1024
    enablePartitioning: false
  }
}

// The sweep's work queue (functions.pipeline.workqueue): one message per due event, each
// reconciled on its own by the `reconcile` function, so one slow relay never holds up
// another event. No sessions (events are independent); duplicate detection on the MessageId
// (a hash of the event's key and the minute a sweep found it due, or the moment a waiter was
// woken: functions.pipeline.workqueue.item_id), so two sweeps queue it once; an
// expired item is not dead-lettered (the next sweep finds the event again from the index).
resource reconcileQueue 'Microsoft.ServiceBus/namespaces/queues@2022-10-01-preview' = {
  parent: namespace
  name: reconcileQueueName
  properties: {
    requiresSession: false
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: false
    defaultMessageTimeToLive: reconcileTimeToLive
    lockDuration: lockDuration
    maxSizeInMegabytes: 1024
    enablePartitioning: false
  }
}

resource notifications 'Microsoft.ServiceBus/namespaces/topics@2022-10-01-preview' = {
  parent: namespace
  name: topicName
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
    defaultMessageTimeToLive: notificationTimeToLive
    maxSizeInMegabytes: 1024
    enablePartitioning: false
  }
}

resource channelSubscriptions 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2022-10-01-preview' = [
  for name in subscriptionNames: {
    parent: notifications
    name: name
    properties: {
      maxDeliveryCount: maxDeliveryCount
      deadLetteringOnMessageExpiration: true
      deadLetteringOnFilterEvaluationExceptions: true
      defaultMessageTimeToLive: notificationTimeToLive
      lockDuration: lockDuration
    }
  }
]

// The relays may only send to `documents` ...
resource relaySendsDocuments 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: documents
  name: guid(documents.id, relayPrincipalId, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: relayPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// ... and to `heartbeats`: kept for relays installed without the heartbeat table (six
// bootstrap arguments, or a relay older than RELAY_HEARTBEAT_TABLE), which heartbeat here.
resource relaySendsHeartbeats 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: heartbeats
  name: guid(heartbeats.id, relayPrincipalId, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: relayPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// The function app receives heartbeats ...
resource functionReceivesHeartbeats 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: heartbeats
  name: guid(heartbeats.id, functionPrincipalId, serviceBusDataReceiver)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// ... documents ...
resource functionReceivesDocuments 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: documents
  name: guid(documents.id, functionPrincipalId, serviceBusDataReceiver)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// ... sends a document back to its own queue, scheduled for later, when processing it failed
// on an outage (functions.triggers.later: an outage burns no deliveries) ...
resource functionSendsDocumentsLater 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: documents
  name: guid(documents.id, functionPrincipalId, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// ... hands due events to its own work queue and takes them from it ...
resource functionSendsWork 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: reconcileQueue
  name: guid(reconcileQueue.id, functionPrincipalId, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionReceivesWork 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: reconcileQueue
  name: guid(reconcileQueue.id, functionPrincipalId, serviceBusDataReceiver)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// ... publishes notifications ...
resource functionSendsNotifications 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: notifications
  name: guid(notifications.id, functionPrincipalId, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// ... and receives them on each channel subscription, scoped to the subscription itself:
// Functions' Service Bus page says a topic trigger's role "needs to have effective scope
// over the Service Bus subscription resource. If only the topic is included, an error will
// occur" (MicrosoftDocs/azure-docs includes/functions-service-bus-permissions.md @
// 1fa9d3b8), and Service Bus's own "Resource scope" list names queue, topic or subscription
// as entities a role applies to, without saying a topic's assignment reaches its
// subscriptions (articles/service-bus-messaging/service-bus-managed-service-identity.md @
// 12aea134). A role on each subscription satisfies both readings.
resource functionReceivesNotifications 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (name, i) in subscriptionNames: {
    scope: channelSubscriptions[i]
    name: guid(channelSubscriptions[i].id, functionPrincipalId, serviceBusDataReceiver)
    properties: {
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
      principalId: functionPrincipalId
      principalType: 'ServicePrincipal'
    }
  }
]

output namespaceName string = namespace.name
output fullyQualifiedNamespace string = '${namespace.name}.servicebus.windows.net'
output queueName string = documents.name
output heartbeatsQueueName string = heartbeats.name
output reconcileQueueName string = reconcileQueue.name
output topicName string = notifications.name
output subscriptionNames array = subscriptionNames
