// Azure Scheduled Events bridge: everything in one resource-group deployment.
//
//   az group create -n rg-sebridge -l westeurope
//   az deployment group create -g rg-sebridge -p infra/main.bicepparam
//
// Least privilege throughout: two user-assigned identities (relays, function app), every
// role assignment scoped to one entity (queue, topic, container, secret, table), except the
// app's Reader on the resource groups its VMs live in (vmScopes: Resource Graph answers
// what the app asks about a VM); built-in roles, except two custom ones holding only the
// actions needed (the relays' heartbeat writes to their own liveness table, storage.bicep;
// the app's acknowledge, eventgrid.bicep). The relays hold no right on anything the app
// reads as truth, and none in Key Vault.

targetScope = 'resourceGroup'

@description('Short name used in every resource name (letters and digits).')
@minLength(2)
@maxLength(10)
param prefix string = 'sebridge'

param location string = resourceGroup().location

param tags object = {
  app: 'scheduled-events-bridge'
}

// ---------- Service Bus ----------
@allowed([
  'Standard'
  'Premium'
])
param serviceBusSku string = 'Standard'

@description('Allow SAS keys on the namespace (for relays that cannot use a managed identity). Off by default.')
param allowServiceBusSasAuth bool = false

@description('Service Bus duplicate detection window for resends (at least 10 minutes).')
@allowed([
  'PT10M'
  'PT30M'
  'PT1H'
  'PT6H'
  'P1D'
])
param duplicateDetectionWindow string = 'PT1H'

@minValue(1)
@maxValue(100)
param maxDeliveryCount int = 10

// ---------- Network ----------
@description('true: create a VNet with a VM subnet and a function subnet. false: add the function subnet to existingVirtualNetworkName.')
param createVirtualNetwork bool = true

@description('The VMs\' existing VNet in this resource group (createVirtualNetwork = false).')
param existingVirtualNetworkName string = ''

param vnetAddressPrefix string = '10.40.0.0/16'

@description('New VNet only: a NAT gateway gives both subnets explicit outbound internet access (relays reach Service Bus, the liveness table and the package URL, the app reaches Teams/Slack/PagerDuty).')
param createNatGateway bool = true

@description('The VM subnet: created (new VNet) or your VMs\' existing subnet.')
param vmSubnetName string = 'snet-vms'

param vmSubnetPrefix string = '10.40.0.0/24'

param functionSubnetName string = 'snet-functions'

@description('Prefix of the function subnet: the only source allowed to reach relay callbacks.')
param functionSubnetPrefix string = '10.40.1.0/24'

@description('An NSG already on your VM subnet: the callback rules are added to it.')
param existingVmNsgName string = ''

@description('TCP port of the relay\'s signed callback server.')
@minValue(1024)
@maxValue(65535)
param relayCallbackPort int = 8492

@description('Port of each relay\'s readiness probe, GET /readyz (RELAY_READY_LISTEN=0.0.0.0:PORT): cloud-init turns it on, the example scale set\'s load balancer probes it, and a drain with no step of yours takes the VM out of rotation through it (issue 38). 0: no probe (and no drain through it).')
@minValue(0)
@maxValue(65535)
param relayReadyPort int = 8493

@description('Who the relays\' hook scripts run as, in a unit of their own outside the relay\'s sandbox: USER[:GROUP,...][+CAP,...], e.g. root, www-data:docker or nginx+CAP_KILL (add-relay.sh\'s 10th argument, written into one systemd drop-in). Empty: a user made for each run, no capabilities. At most 64 characters: it travels in customData, whose room is measured with the longest value (tests/infra/customdata.py).')
@maxLength(64)
param relayHookAs string = ''

// ---------- Secrets (Key Vault) ----------
@description('The app\'s own master secret (APP_SECRET), at least 32 characters (e.g. `openssl rand -hex 32`): wraps the relays\' stored callback keys, keys the approval page tokens. Only the function app reads it.')
@secure()
@minLength(32)
param appSecret string

@secure()
param pagerdutyRoutingKey string = ''

@secure()
param teamsWebhookUrl string = ''

@secure()
param slackWebhookUrl string = ''

@secure()
param webhookUrl string = ''

@secure()
param webhookSecret string = ''

@description('During a rotation of appSecret: the value it replaces (APP_SECRET_PREVIOUS). Relays\' keys stored under it still open and are stored again under the new one; remove it once the relays have been heard from. Empty: no rotation under way.')
@secure()
param appSecretPrevious string = ''

@description('During a rotation of webhookSecret: the value it replaces (WEBHOOK_SECRET_PREVIOUS). Webhooks are signed with both until it is removed.')
@secure()
param webhookSecretPrevious string = ''

@description('Empty (the default): the vault is named from the resource group. After deleting and recreating the group, the old vault is kept soft-deleted (purge protection) under that name: give any new word here for a new vault name, or set keyVaultCreateMode=recover to get the old one back.')
@maxLength(20)
param keyVaultNameSeed string = ''

@description('default, or recover: recover the soft-deleted vault of this name (after the resource group was deleted and recreated).')
@allowed([
  'default'
  'recover'
])
param keyVaultCreateMode string = 'default'

@description('Key Vault firewall default. Deny: only the function and VM subnets (service endpoints) and trusted Azure services get through.')
@allowed([
  'Allow'
  'Deny'
])
param keyVaultNetworkDefaultAction string = 'Deny'

// ---------- Function app ----------
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('Always-ready Flex instances for the ingest function (0: none): one keeps VMs\' sessions off instances being scaled in (Azure/azure-sdk-for-net#58170; modules/functionapp.bicep). About 5 USD a month at 512 MB.')
@minValue(0)
@maxValue(10)
param ingestAlwaysReady int = 1

@description('Always-ready Flex instances for the reconcile function (0: none): one keeps a work item of a 30 s Preempt from waiting for a cold start (modules/functionapp.bicep). About 5 USD a month at 512 MB.')
@minValue(0)
@maxValue(10)
param reconcileAlwaysReady int = 1

param relaySilentAfterSeconds int = 600

param approvalMarginSeconds int = 10

@description('POLICY__RULES: ordered rules. Empty = the setting left out = Microsoft\'s reference policy (drain Terminate, approve User events and Freeze < 9 s, hold the rest), as POLICY__RULES=[] is.')
param policyRules array = []

@description('POLICY__DRY_RUN: decide, audit and announce, never approve.')
param policyDryRun bool = false

@description('POLICY__WINDOWS: weekly maintenance windows.')
param policyWindows array = []

@description('POLICY__TIMEZONE: IANA time zone of the windows.')
param policyTimezone string = 'UTC'

@description('POLICY__MAX_CONCURRENT_PER_SET: approved impactful events at once per scale set / availability set.')
@minValue(1)
param policyMaxConcurrentPerSet int = 1

@description('POLICY__BUDGETS: disruption budgets, e.g. [{"name": "checkout", "group_by": "tag:service", "max_unavailable": 1}]. Empty: only the default budget over sets (policyMaxConcurrentPerSet).')
param policyBudgets array = []

param drainHttpUrl string = ''

param drainRelayHook string = ''

@description('UNDRAIN__HTTP_URL: puts an instance back in service when its drained Terminate is cancelled.')
param undrainHttpUrl string = ''

@description('UNDRAIN__RELAY_HOOK: the relays\' hook script that undoes DRAIN__RELAY_HOOK.')
param undrainRelayHook string = ''

@allowed([
  'hold'
  'approve'
])
param drainOnFailure string = 'hold'

// ---------- Per-VM identity: where the VMs live ----------
@description('Resource ids of the resource groups (/subscriptions/ID/resourceGroups/NAME) where relayed VMs live: the function app gets Reader on each, to look a VM up in Azure Resource Graph by its vmId. Default: this deployment\'s resource group. The deployer needs the right to assign roles in each (infra/README.md).')
param vmScopes array = [
  resourceGroup().id
]

@description('ALLOWED_SUBSCRIPTIONS: subscription ids whose VMs may send (their attested documents name it). Empty (the default): the subscriptions of vmScopes (by default, this deployment\'s).')
param allowedSubscriptions array = []

@description('ATTESTATION_MODE: enforce (the default) rejects a message whose IMDS attested document fails the check; report only reports: each failure is logged and counted, and such a message is admitted only with the callback key of its VM from an earlier attested message (never enrols a key, never asks Resource Graph). Switch to enforce once the fleet page counts none.')
@allowed([
  'enforce'
  'report'
])
param attestationMode string = 'enforce'

// ---------- Agentless mode (preview): Event Grid + Resource Manager ----------
@description('Create the Event Grid system topic (Microsoft.ResourceNotifications.MaintenanceResources) and its subscription to the scheduled-events queue. Register the preview features first (README).')
param enableEventGrid bool = false

@description('Event Grid delivery schema.')
@allowed([
  'CloudEventSchemaV1_0'
  'EventGridSchema'
])
param eventGridDeliverySchema string = 'CloudEventSchemaV1_0'

@description('Where the function app may acknowledge Scheduled Events through Resource Manager: [{resourceGroup: \'rg\'}] or [{resourceGroup: \'rg\', resourceType: \'virtualMachineScaleSets\', name: \'vmss\'}]. Empty: it cannot (relays approve).')
param acknowledgeScopes array = []

@description('Object id in your tenant of the Maintenance resource provider\'s service principal (application id 78315a30-673a-4a46-8e5c-ce59dbc6adf8): `az ad sp show --id 78315a30-673a-4a46-8e5c-ce59dbc6adf8 --query id -o tsv`. With enableEventGrid it is given Scheduled Events Contributor on each resource group of vmScopes and acknowledgeScopes, as Learn\'s Event Grid and Resource Graph pages ask (infra/README.md). Empty: not assigned (the deployment output says so).')
param maintenanceProviderPrincipalId string = ''

@description('APPROVERS: relay,arm (relay first, ARM when no relay can), arm, or relay. Empty (the default): relay,arm when acknowledgeScopes names a scope, else relay (the app has no acknowledge role anywhere).')
@allowed([
  ''
  'relay,arm'
  'arm,relay'
  'arm'
  'relay'
])
param approvers string = ''

@description('Opt the example VM and scale set in to Event Grid publishing (scheduledEventsPolicy; Compute API 2025-04-01, preview feature).')
param exampleEventGridOptIn bool = false
// ---------- Operators' pages and alerts ----------
@description('Client id of the Entra app registration for the approval and fleet pages (README: Approval page). Empty: the pages are off.')
param operatorsClientId string = ''

@description('Object id of the Entra group allowed to use the pages.')
param operatorsGroupId string = ''

@description('App role (value) allowed to use the pages, instead of or besides the group.')
param operatorsAppRole string = ''

@description('Custom domain the operators use, e.g. https://bridge.contoso.com. Empty: the app\'s own host name.')
param publicBaseUrl string = ''

@description('E-mail address for alerts (dead letters, function failures, watchdog not running, relay_silent, approval_failed, policy_invalid, admission rejections). Name a receiver here or in alertActionGroupId: with neither, the alerts notify nobody and the alertReceivers output says NONE.')
param alertEmail string = ''

@description('Resource id of an existing action group (your on-call routing: e-mail, SMS, Teams, PagerDuty, ...) that every alert notifies too.')
param alertActionGroupId string = ''

@description('Alert when admission rejects more than this share (percent) of relay messages in 15 minutes (at least 50 judged): the sign of a mismatch with Azure, not of one bad VM.')
@minValue(1)
@maxValue(100)
param admissionRejectPercent int = 20

@description('The admission-rejections alert also needs at least this many rejected messages in its 15 minutes (a small fleet never reaches a minimum of messages judged).')
@minValue(1)
param admissionRejectMinimum int = 3

// ---------- Example VMs ----------
@description('Deploy the example scale set (relay + Terminate notifications).')
param deployExampleScaleSet bool = false

@description('Deploy the example single VM (relay).')
param deployExampleVm bool = false

@description('Empty (the default): cloud-init installs the relay embedded from infra/relay/scheduled-events-relay.pyz.xz. Or https://HOST/scheduled-events-relay.pyz#sha256=HEX (a release asset and its checksum), installed only if the checksum matches. At most 256 characters: it travels in customData, whose room is measured with the longest value (tests/infra/customdata.py).')
@maxLength(256)
param relayPackageUrl string = ''

param adminUsername string = 'azureuser'

// Asked for only when an example machine is deployed (module exampleSshKey below).
@description('SSH public key for the example VMs (password login is off), e.g. the contents of ~/.ssh/id_ed25519.pub. Needed only with deployExampleScaleSet or deployExampleVm; empty otherwise.')
param adminSshPublicKey string = ''

@description('Terminate notification timeout of the example scale set (PT5M..PT15M).')
@allowed([
  'PT5M'
  'PT6M'
  'PT7M'
  'PT8M'
  'PT9M'
  'PT10M'
  'PT11M'
  'PT12M'
  'PT13M'
  'PT14M'
  'PT15M'
])
param terminateNotBeforeTimeout string = 'PT10M'

param exampleInstanceCount int = 2

// ---------- Names ----------
var suffix = uniqueString(resourceGroup().id, prefix)
var names = {
  relayIdentity: 'id-${prefix}-relay'
  functionIdentity: 'id-${prefix}-func'
  serviceBus: 'sb-${prefix}-${suffix}'
  storage: take(toLower('st${prefix}${suffix}'), 24)
  keyVault: take('kv-${prefix}-${empty(keyVaultNameSeed) ? suffix : uniqueString(resourceGroup().id, prefix, keyVaultNameSeed)}', 24)
  workspace: 'log-${prefix}-${suffix}'
  appInsights: 'appi-${prefix}-${suffix}'
  functionApp: 'func-${prefix}-${suffix}'
  plan: 'plan-${prefix}-${suffix}'
  vnet: createVirtualNetwork ? 'vnet-${prefix}' : existingVirtualNetworkName
  nsg: 'nsg-${prefix}-vms'
  natGateway: 'ng-${prefix}'
  scaleSet: 'vmss-${prefix}'
  loadBalancer: 'lbi-${prefix}-vms'
  vm: 'vm-${prefix}'
}

// /subscriptions/SUB/resourceGroups/RG -> SUB, RG (split on '/': '', subscriptions, SUB, resourceGroups, RG).
var vmScopeSubscriptions = [for id in vmScopes: split(id, '/')[2]]
var effectiveAllowedSubscriptions = empty(allowedSubscriptions) ? union(vmScopeSubscriptions, []) : allowedSubscriptions

// The resource groups where opted-in VMs live: the Maintenance resource provider's
// Scheduled Events Contributor goes on each (modules/maintenance-provider.bicep).
var acknowledgeGroupIds = [for scope in acknowledgeScopes: '${subscription().id}/resourceGroups/${scope.resourceGroup}']
var scheduledEventGroups = union(vmScopes, acknowledgeGroupIds)
var assignMaintenanceProvider = enableEventGrid && !empty(maintenanceProviderPrincipalId)

// ARM approves only where the acknowledge role is assigned (acknowledgeScopes).
var effectiveApprovers = !empty(approvers) ? approvers : (empty(acknowledgeScopes) ? 'relay' : 'relay,arm')

// add-relay.sh's PACKAGE_URL in relayBootstrapArguments: a word even when empty.
var relayPackageArgument = empty(relayPackageUrl) ? 'embedded' : relayPackageUrl

// ---------- Identities ----------
resource relayIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: names.relayIdentity
  location: location
  tags: tags
}

resource functionIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: names.functionIdentity
  location: location
  tags: tags
}

// ---------- Building blocks ----------
module network 'modules/network.bicep' = {
  name: 'network'
  params: {
    location: location
    tags: tags
    createVirtualNetwork: createVirtualNetwork
    virtualNetworkName: names.vnet
    addressPrefix: vnetAddressPrefix
    createNatGateway: createNatGateway
    natGatewayName: names.natGateway
    vmSubnetName: vmSubnetName
    vmSubnetPrefix: vmSubnetPrefix
    functionSubnetName: functionSubnetName
    functionSubnetPrefix: functionSubnetPrefix
    callbackPort: relayCallbackPort
    readyPort: relayReadyPort
    nsgName: names.nsg
    existingNsgName: existingVmNsgName
  }
}

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus'
  params: {
    namespaceName: names.serviceBus
    location: location
    tags: tags
    sku: serviceBusSku
    allowSasAuth: allowServiceBusSasAuth
    duplicateDetectionWindow: duplicateDetectionWindow
    maxDeliveryCount: maxDeliveryCount
    relayPrincipalId: relayIdentity.properties.principalId
    functionPrincipalId: functionIdentity.properties.principalId
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  params: {
    accountName: names.storage
    location: location
    tags: tags
    functionPrincipalId: functionIdentity.properties.principalId
    relayPrincipalId: relayIdentity.properties.principalId
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    workspaceName: names.workspace
    appInsightsName: names.appInsights
    location: location
    tags: tags
    functionPrincipalId: functionIdentity.properties.principalId
    serviceBusNamespaceName: serviceBus.outputs.namespaceName
    // Every queue and the topic (its count covers its subscriptions).
    deadLetterEntities: [
      serviceBus.outputs.queueName
      serviceBus.outputs.heartbeatsQueueName
      eventGrid.outputs.queueName
      serviceBus.outputs.topicName
    ]
    alertEmail: alertEmail
    alertActionGroupId: alertActionGroupId
    admissionRejectPercent: admissionRejectPercent
    admissionRejectMinimum: admissionRejectMinimum
  }
}

module keyVault 'modules/keyvault.bicep' = {
  name: 'keyvault'
  params: {
    vaultName: names.keyVault
    location: location
    tags: tags
    appSecret: appSecret
    pagerdutyRoutingKey: pagerdutyRoutingKey
    teamsWebhookUrl: teamsWebhookUrl
    slackWebhookUrl: slackWebhookUrl
    webhookUrl: webhookUrl
    webhookSecret: webhookSecret
    appSecretPrevious: appSecretPrevious
    webhookSecretPrevious: webhookSecretPrevious
    functionPrincipalId: functionIdentity.properties.principalId
    networkDefaultAction: keyVaultNetworkDefaultAction
    createMode: keyVaultCreateMode
    // The function subnet only: relays read nothing in the vault.
    allowedSubnetIds: [
      network.outputs.functionSubnetId
    ]
  }
}

module eventGrid 'modules/eventgrid.bicep' = {
  name: 'eventgrid'
  dependsOn: [
    serviceBus
    storage
  ]
  params: {
    namespaceName: serviceBus.outputs.namespaceName
    storageAccountName: storage.outputs.accountName
    tags: tags
    enableEventGrid: enableEventGrid
    eventDeliverySchema: eventGridDeliverySchema
    maxDeliveryCount: maxDeliveryCount
    functionPrincipalId: functionIdentity.properties.principalId
    acknowledgeScopes: acknowledgeScopes
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  // Role assignments first, so the host and the Key Vault references work at first start.
  dependsOn: [
    serviceBus
    storage
    monitoring
    keyVault
    eventGrid
  ]
  params: {
    name: names.functionApp
    planName: names.plan
    location: location
    tags: tags
    identityId: functionIdentity.id
    identityClientId: functionIdentity.properties.clientId
    storageAccountName: storage.outputs.accountName
    deploymentContainerUrl: storage.outputs.deploymentContainerUrl
    functionSubnetId: network.outputs.functionSubnetId
    appInsightsConnectionString: monitoring.outputs.connectionString
    serviceBusFullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
    documentsQueueName: serviceBus.outputs.queueName
    heartbeatsQueueName: serviceBus.outputs.heartbeatsQueueName
    reconcileQueueName: serviceBus.outputs.reconcileQueueName
    notificationsTopicName: serviceBus.outputs.topicName
    stateTablePrefix: storage.outputs.tablePrefix
    keyVaultUri: keyVault.outputs.vaultUri
    secretNames: keyVault.outputs.secretNames
    hasPagerduty: keyVault.outputs.hasPagerduty
    hasTeams: keyVault.outputs.hasTeams
    hasSlack: keyVault.outputs.hasSlack
    hasWebhookUrl: keyVault.outputs.hasWebhookUrl
    hasWebhookSecret: keyVault.outputs.hasWebhookSecret
    hasAppSecretPrevious: keyVault.outputs.hasAppSecretPrevious
    hasWebhookSecretPrevious: keyVault.outputs.hasWebhookSecretPrevious
    maximumInstanceCount: maximumInstanceCount
    ingestAlwaysReady: ingestAlwaysReady
    reconcileAlwaysReady: reconcileAlwaysReady
    relayCallbackPort: relayCallbackPort
    allowedSubscriptions: effectiveAllowedSubscriptions
    relaySilentAfterSeconds: relaySilentAfterSeconds
    approvalMarginSeconds: approvalMarginSeconds
    policyRules: policyRules
    policyDryRun: policyDryRun
    policyWindows: policyWindows
    policyTimezone: policyTimezone
    policyMaxConcurrentPerSet: policyMaxConcurrentPerSet
    policyBudgets: policyBudgets
    drainHttpUrl: drainHttpUrl
    drainRelayHook: drainRelayHook
    undrainHttpUrl: undrainHttpUrl
    undrainRelayHook: undrainRelayHook
    drainOnFailure: drainOnFailure
    relayReadyPort: relayReadyPort
    eventGridQueueName: eventGrid.outputs.queueName
    approvers: effectiveApprovers
    attestationMode: attestationMode
    operatorsClientId: operatorsClientId
    operatorsGroupId: operatorsGroupId
    operatorsAppRole: operatorsAppRole
    publicBaseUrl: publicBaseUrl
  }
}

// Reader for the app on each resource group of vmScopes, deployed in that group (a module
// scoped to it; the group may be in another subscription).
module vmReaders 'modules/vm-reader.bicep' = [
  for scopeId in vmScopes: {
    name: 'vm-reader-${uniqueString(resourceGroup().id, scopeId)}'
    scope: resourceGroup(split(scopeId, '/')[2], split(scopeId, '/')[4])
    params: {
      functionPrincipalId: functionIdentity.properties.principalId
    }
  }
]

// Scheduled Events Contributor for the Maintenance resource provider (Learn: Scheduled
// Events in Event Grid / Resource Graph), on each group where opted-in VMs live.
module maintenanceProvider 'modules/maintenance-provider.bicep' = [
  for scopeId in (assignMaintenanceProvider ? scheduledEventGroups : []): {
    name: 'maint-rp-${uniqueString(resourceGroup().id, scopeId)}'
    scope: resourceGroup(split(scopeId, '/')[2], split(scopeId, '/')[4])
    params: {
      maintenanceProviderPrincipalId: maintenanceProviderPrincipalId
    }
  }
]

// ---------- Relay bootstrap (cloud-init) ----------
// Each {{NAME}} in infra/relay/cloud-init.yaml, filled in from this deployment: the relay
// itself (infra/relay/scheduled-events-relay.pyz.xz, `make relay`: the zipapp xz-compressed whole;
// a test keeps it equal to a fresh build of relay/), the bootstrap script (infra/relay/add-relay.sh) and its ten
// arguments (the 8th `none`: hook scripts are yours, on your VMs; the 9th the readiness port;
// the 10th who hook scripts run as). Filled in, it stays under customData's 65535 bytes (tests/infra).
// The 5th argument was the relay key's Key Vault secret URI: there is no shared key any more,
// and the position is kept with the word `none` (relayKeyArgument) so that the 6th and 7th
// stay where add-relay.sh reads them.
var relayKeyArgument = 'none'
// add-relay.sh's 9th argument: the readiness port, or `off`.
var relayReadyArgument = (relayReadyPort > 0) ? string(relayReadyPort) : 'off'
// Only when it is installed from there: with relayPackageUrl the VM installs the release
// asset and never reads the embedded copy (add-relay.sh), so customData does not carry it.
var relayPyzB64 = empty(relayPackageUrl) ? loadFileAsBase64('relay/scheduled-events-relay.pyz.xz') : ''
var addRelayScriptB64 = loadFileAsBase64('relay/add-relay.sh.gz') // add-relay.sh gzipped (make relay)
// relay/cloud-init.yaml installs and starts the relay on first boot (any image whose python3
// is 3.9 or newer: Ubuntu 20.04+, Debian 11+, RHEL 9, Azure Linux) with nothing to download:
// it carries the relay itself (relay/scheduled-events-relay.pyz.xz: the zipapp xz-compressed as
// a whole, base64; add-relay.sh unpacks it) and add-relay.sh (less its comments, gzipped, base64: relay/add-relay.sh.gz),
// which installs it with its unit, wired by its seven arguments: each double-braced NAME in it
// is filled in below. The 5th is the word `none`, the 7th the relays' liveness table. Azure
// caps customData at 65535 bytes once decoded; filled in, it leaves at least 8 KiB spare
// (tests/infra/test_customdata.py; make bench: relay_customdata_spare_bytes). Comments stay
// here, not in the file: every byte of it travels in customData. No secret is in it.
var cloudInitTemplate = loadTextContent('relay/cloud-init.yaml')
var cloudInit0 = replace(cloudInitTemplate, '{{RELAY_PYZ_B64}}', relayPyzB64)
var cloudInit1 = replace(cloudInit0, '{{ADD_RELAY_SCRIPT_B64}}', addRelayScriptB64)
var cloudInit2 = replace(cloudInit1, '{{SERVICEBUS_NAMESPACE}}', serviceBus.outputs.fullyQualifiedNamespace)
var cloudInit3 = replace(cloudInit2, '{{DOCUMENTS_QUEUE}}', serviceBus.outputs.queueName)
var cloudInit4 = replace(cloudInit3, '{{IDENTITY_CLIENT_ID}}', relayIdentity.properties.clientId)
var cloudInit5 = replace(cloudInit4, '{{CALLBACK_PORT}}', string(relayCallbackPort))
var cloudInit6 = replace(cloudInit5, '{{RELAY_KEY_SECRET_URI}}', relayKeyArgument)
var cloudInit7 = replace(cloudInit6, '{{RELAY_PACKAGE_URL}}', relayPackageUrl)
var cloudInit8 = replace(cloudInit7, '{{HEARTBEAT_TABLE_URL}}', storage.outputs.livenessTableUrl)
var cloudInit9 = replace(cloudInit8, '{{RELAY_HOOKS}}', 'none')
var cloudInit10 = replace(cloudInit9, '{{READY_PORT}}', relayReadyArgument)
var relayCloudInit = replace(cloudInit10, '{{HOOK_AS}}', relayHookAs)

// An example machine needs the key: with one on and an empty key, this parameter-only module
// (nothing of its own to wait for) fails validation naming adminSshPublicKey, instead of the
// example's own deployment failing after the rest was built.
module exampleSshKey 'modules/example-ssh-key.bicep' = if (deployExampleScaleSet || deployExampleVm) {
  name: 'example-ssh-key'
  params: {
    adminSshPublicKey: adminSshPublicKey
  }
}

// The example scale set sits behind an internal load balancer whose health probe is each
// relay's /readyz (issue 38): a drain turns the probe 503 and the load balancer stops sending
// the instance new flows before Azure deletes it, with no script of yours.
var exampleBehindLoadBalancer = deployExampleScaleSet && relayReadyPort > 0

module exampleLoadBalancer 'modules/relay-ready-lb.bicep' = if (exampleBehindLoadBalancer) {
  name: 'example-load-balancer'
  params: {
    name: names.loadBalancer
    location: location
    tags: tags
    subnetId: network.outputs.vmSubnetId
    readyPort: relayReadyPort
  }
}

module exampleScaleSet 'modules/vmss-relay.bicep' = if (deployExampleScaleSet) {
  name: 'example-scaleset'
  params: {
    name: names.scaleSet
    location: location
    tags: tags
    subnetId: network.outputs.vmSubnetId
    relayIdentityId: relayIdentity.id
    customData: relayCloudInit
    adminUsername: adminUsername
    adminSshPublicKey: adminSshPublicKey
    instanceCount: exampleInstanceCount
    terminateNotBeforeTimeout: terminateNotBeforeTimeout
    eventGridOptIn: exampleEventGridOptIn
    loadBalancerBackendPoolId: exampleBehindLoadBalancer ? exampleLoadBalancer.outputs.backendPoolId : ''
  }
}

module exampleVm 'modules/vm-relay.bicep' = if (deployExampleVm) {
  name: 'example-vm'
  params: {
    name: names.vm
    location: location
    tags: tags
    subnetId: network.outputs.vmSubnetId
    relayIdentityId: relayIdentity.id
    customData: relayCloudInit
    adminUsername: adminUsername
    adminSshPublicKey: adminSshPublicKey
    eventGridOptIn: exampleEventGridOptIn
  }
}

// Which drain a `drain` decision runs (functions/terminate/plan.py): the HTTP hook wins where
// set; otherwise the relays' hook, and each relay's readiness probe where a relay lacks that
// hook; with no step of yours, the probe alone (issue 38), only on a VM a load balancer
// probes (issue 44: its relay reports Azure's probes): /readyz answers 503, the load
// balancer takes the VM out, the drain waits the probe's timing plus
// DRAIN__CONNECTION_SECONDS, then approves; elsewhere the VM has no drain.
var readinessDrain = 'readiness (the default): on each VM a load balancer probes (its relay reports the Azure probes), the /readyz probe of its relay (port ${relayReadyPort}) answers 503, the load balancer takes the VM out, the drain waits the probe timing plus DRAIN__CONNECTION_SECONDS, then approves; a VM no load balancer probes has no drain (a Platform event or a scale-in held until NotBefore, a User Reboot or Redeploy approved at once)'
var hookDrain = 'relay hook ${drainRelayHook} on each VM${(relayReadyPort > 0) ? '; the readiness probe where a relay lacks it' : ''}'
var httpDrain = 'HTTP hook DRAIN__HTTP_URL${empty(drainRelayHook) ? '' : ', then the relay hook ${drainRelayHook}'}'
var noDrain = 'NONE: no drain step and no readiness probe (relayReadyPort 0): a Platform event or a scale-in is held until NotBefore, and Azure then goes ahead undrained; a User Reboot or Redeploy is approved at once'
var drainSummary = !empty(drainHttpUrl) ? httpDrain : (!empty(drainRelayHook) ? hookDrain : ((relayReadyPort > 0) ? readinessDrain : noDrain))

// ---------- What you need next ----------
output functionAppName string = functionApp.outputs.name
// Who hears the bridge's alerts; starts with NONE when nobody does (alertEmail, alertActionGroupId).
output alertReceivers string = monitoring.outputs.alertReceivers
// Which drain applies to a `drain` decision (readiness by default: no script of yours needed).
output drain string = drainSummary
// The relays' readiness probe: its port, and what probes it (the example scale set's load balancer).
output readinessProbe string = (relayReadyPort > 0) ? 'GET /readyz on port ${relayReadyPort} of each relay (add-relay.sh and cloud-init turn it on)${exampleBehindLoadBalancer ? '; the example scale set\'s load balancer ${names.loadBalancer} probes it' : ''}' : 'off (relayReadyPort 0)'
output functionAppUrl string = functionApp.outputs.url
output serviceBusNamespace string = serviceBus.outputs.namespaceName
output serviceBusFullyQualifiedNamespace string = serviceBus.outputs.fullyQualifiedNamespace
output documentsQueue string = serviceBus.outputs.queueName
output heartbeatsQueue string = serviceBus.outputs.heartbeatsQueueName
output eventGridQueue string = eventGrid.outputs.queueName
output notificationsTopic string = serviceBus.outputs.topicName
output keyVaultName string = keyVault.outputs.vaultName
output storageAccountName string = storage.outputs.accountName
output relayIdentityId string = relayIdentity.id
output relayIdentityClientId string = relayIdentity.properties.clientId
output relayIdentityPrincipalId string = relayIdentity.properties.principalId
output functionIdentityClientId string = functionIdentity.properties.clientId
output vmSubnetId string = network.outputs.vmSubnetId
output functionSubnetId string = network.outputs.functionSubnetId
output relayCallbackPort int = relayCallbackPort
// The seven arguments of infra/relay/add-relay.sh, for existing VMs and scale sets (README),
// space-separated for `--parameters $ARGS`: an empty package URL is written `embedded`, and
// the former key secret URI `none`, so that word splitting keeps all seven.
output relayBootstrapArguments string = '${serviceBus.outputs.fullyQualifiedNamespace} ${serviceBus.outputs.queueName} ${relayIdentity.properties.clientId} ${relayCallbackPort} ${relayKeyArgument} ${relayPackageArgument} ${storage.outputs.livenessTableUrl}'
output relayForward string = 'servicebus://${serviceBus.outputs.fullyQualifiedNamespace}/${serviceBus.outputs.queueName}'
// The relays' --heartbeat-table (RELAY_HEARTBEAT_TABLE): their own liveness table.
output relayHeartbeatTable string = storage.outputs.livenessTableUrl
// Whether the Maintenance resource provider got Scheduled Events Contributor here; if not
// (with Event Grid on), the exact command that gives it (infra/README.md, first deploy).
output maintenanceProviderRole string = !enableEventGrid ? 'not needed (enableEventGrid is false)' : (assignMaintenanceProvider ? 'assigned on ${length(scheduledEventGroups)} resource group(s)' : 'NOT ASSIGNED: set maintenanceProviderPrincipalId to the output of: az ad sp show --id 78315a30-673a-4a46-8e5c-ce59dbc6adf8 --query id -o tsv')
// What ALLOWED_SUBSCRIPTIONS holds (comma-separated).
output allowedSubscriptions string = join(effectiveAllowedSubscriptions, ',')
