// The function app on the Flex Consumption plan (Python 3.11), with a user-assigned managed
// identity used for every connection: Service Bus, storage (host, deployment, state tables),
// Application Insights and Key Vault references. No connection string, key or secret value
// appears in its settings; secrets are Key Vault references.

param name string

param planName string

param location string

param tags object = {}

@description('Resource id of the function app\'s user-assigned managed identity.')
param identityId string

@description('Client id of that identity (identity-based connections pick it by client id).')
param identityClientId string

param storageAccountName string

@description('URL of the blob container the plan deploys the app package from.')
param deploymentContainerUrl string

@description('Resource id of the subnet delegated to Microsoft.App/environments in the VMs\' VNet.')
param functionSubnetId string

param appInsightsConnectionString string

@description('e.g. sb-bridge.servicebus.windows.net')
param serviceBusFullyQualifiedNamespace string

param documentsQueueName string = 'documents'

param heartbeatsQueueName string = 'heartbeats'

@description('The sweep\'s work queue of due events (functions.pipeline.workqueue).')
param reconcileQueueName string = 'reconcile'

param notificationsTopicName string = 'notifications'

param stateTablePrefix string = 'sebridge'

@description('https://NAME.vault.azure.net/ (with the trailing slash, as the vault reports it).')
param keyVaultUri string

@description('Secret names in the vault (keyvault.bicep output secretNames).')
param secretNames object

param hasPagerduty bool = false
param hasTeams bool = false
param hasSlack bool = false
param hasWebhookUrl bool = false
param hasWebhookSecret bool = false
// During a rotation (APP_SECRET_PREVIOUS, WEBHOOK_SECRET_PREVIOUS): the secrets replaced.
param hasAppSecretPrevious bool = false
param hasWebhookSecretPrevious bool = false

@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

// Measured (functions/README.md, "Sizing"): the Python worker running ingest peaks at
// about 70 MB for a 200-VM set and 85 MB for a 1,000-VM set at 16-32 sessions at once, so
// the smallest instance leaves room for the host; billing is per GB-second of it.
@description('Flex Consumption instance memory. 512 fits the measured worker; raise it only for a very large POLICY or fleet.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 512

// Flex scale-in and sessions (issue 38): an instance being scaled in stops taking messages
// but keeps renewing the session locks it holds until the host shuts down or
// maxAutoLockRenewalDuration (host.json, 20 min, which the drain needs) runs out, so a VM's
// next documents wait behind it (Azure/azure-sdk-for-net issue 58170; the fix, pull request
// 63119, closes the session processor on drain and is not released yet). An always-ready
// instance for `ingest` is never scaled in: a fleet whose documents fit one instance (16
// sessions at once) never has its sessions held by a draining one; burst instances still
// can. Billed as Flex's always-ready baseline (docs/cost.md). 0 turns it off.
@description('Always-ready instances for the ingest function (0: none). One keeps VMs\' sessions off instances being scaled in (Azure/azure-sdk-for-net#58170).')
@minValue(0)
@maxValue(10)
param ingestAlwaysReady int = 1

// Flex scales each non-HTTP function on its own (per-function scaling), so `reconcile`
// has no instance while its queue is empty, and a work item then waits for the scale
// controller to see the queue and for a cold Python host to start (issue 46). That item
// may be a wake-up or the next try of a Preempt, which has about 30 s of notice in all
// (docs/cost.md, "A warm reconcile"). One always-ready instance keeps it warm. Billed as
// Flex's always-ready baseline, like ingest's. 0 turns it off.
@description('Always-ready instances for the reconcile function (0: none). One keeps a work item of a 30 s Preempt from waiting for a cold start.')
@minValue(0)
@maxValue(10)
param reconcileAlwaysReady int = 1

// Flex names a single function's always-ready group `function:<name>`.
var ingestReady = [
  {
    name: 'function:ingest'
    instanceCount: ingestAlwaysReady
  }
]
var reconcileReady = [
  {
    name: 'function:reconcile'
    instanceCount: reconcileAlwaysReady
  }
]

// The Python worker runs every synchronous invocation on one thread pool
// (PYTHON_THREADPOOL_THREAD_COUNT, Learn "App settings reference for Azure Functions" and
// "Improve throughput performance of Python apps"); left unset, Python 3.9+ takes
// ThreadPoolExecutor's default, min(32, CPUs + 4): 5 or 6 threads on a small instance, while
// host.json lets 16 reconcile items (maxConcurrentCalls) and 16 VMs' sessions
// (maxConcurrentSessions) run at once, and a drain sleeps in its thread. Sized to both at
// once (tests/infra/test_functionapp.py reads host.json), so none waits for a thread.
var pythonThreadCount = 32

// Bridge behaviour (SETTINGS.md).
param relaySilentAfterSeconds int = 600
@description('Days ended events, rejected envelopes and VMs not heard from are kept.')
@minValue(1)
@maxValue(3650)
param retentionDays int = 30
param approvalMarginSeconds int = 10
param pagerdutyEventsUrl string = 'https://events.pagerduty.com/v2/enqueue'

// Per-VM identity (contract §2, §3, §6): the port every relay's callback listens on (the app
// calls Azure's address for the VM on it), and the subscriptions whose VMs may send (the
// attested document's subscriptionId; comma-separated ids in ALLOWED_SUBSCRIPTIONS).
@minValue(1024)
@maxValue(65535)
param relayCallbackPort int = 8492
@description('Subscription ids whose VMs may send. Empty: the app accepts any subscription its identity can read in Resource Graph (its Reader scopes).')
param allowedSubscriptions array = []
@description('ATTESTATION_MODE: enforce rejects a message whose attested document fails; report logs and counts it (would reject) and admits it only with the callback key of its VM from an earlier attested message (a rollout).')
@allowed([
  'enforce'
  'report'
])
param attestationMode string = 'enforce'

// Agentless mode (eventgrid.bicep): the queue Event Grid delivers to, and the approvers.
param eventGridQueueName string = 'scheduled-events'
param approvers string = 'relay,arm'

// Policy (POLICY__*); editable later as app settings.
@description('Ordered policy rules (JSON array). Empty: the built-in default, Microsoft\'s reference policy.')
param policyRules array = []
param policyDryRun bool = false
param policyWindows array = []
param policyTimezone string = 'UTC'
@minValue(1)
param policyMaxConcurrentPerSet int = 1
@description('Disruption budgets (JSON array). Empty: only the default budget over sets.')
param policyBudgets array = []

// Operators' pages (approval, fleet): App Service Authentication with Microsoft Entra ID.
@description('Client id of the Entra app registration operators sign in with. Empty: no sign-in, the pages are off and cards carry no buttons.')
param operatorsClientId string = ''
@description('Tenant of that app registration.')
param operatorsTenantId string = tenant().tenantId
@description('Object id of the Entra group whose members may use the pages (OPERATORS_GROUP_ID).')
param operatorsGroupId string = ''
@description('App role (value) whose holders may use the pages (OPERATORS_APP_ROLE).')
param operatorsAppRole string = ''
@description('Where people reach the app, if not its own host name (a custom domain). Empty: the app uses WEBSITE_HOSTNAME.')
param publicBaseUrl string = ''

// Terminate (drain) workflow (DRAIN__*).
param drainHttpUrl string = ''
param drainRelayHook string = ''
// Undoing a drain whose Terminate was cancelled (UNDRAIN__*).
param undrainHttpUrl string = ''
param undrainRelayHook string = ''
param drainStepTimeoutSeconds int = 120
param drainSafetyMarginSeconds int = 30
@allowed([
  'hold'
  'approve'
])
param drainOnFailure string = 'hold'
// DRAIN__READINESS: drain a VM through its relay's readiness probe where no step of yours
// applies (issue 38); off with the probe (relayReadyPort 0): a relay without /readyz cannot
// be drained through it.
param relayReadyPort int = 8493

// A Key Vault reference: the platform resolves it with keyVaultReferenceIdentity.
var kvRef = '@Microsoft.KeyVault(SecretUri=${keyVaultUri}secrets/'

var connectionSettings = {
  AZURE_CLIENT_ID: identityClientId
  AzureWebJobsStorage__accountName: storageAccountName
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  ServiceBusConnection__fullyQualifiedNamespace: serviceBusFullyQualifiedNamespace
  ServiceBusConnection__credential: 'managedidentity'
  ServiceBusConnection__clientId: identityClientId
  StateStorage__accountName: storageAccountName
  StateStorage__credential: 'managedidentity'
  StateStorage__clientId: identityClientId
  APPLICATIONINSIGHTS_CONNECTION_STRING: appInsightsConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'
}

var bridgeSettings = {
  DOCUMENTS_QUEUE: documentsQueueName
  HEARTBEATS_QUEUE: heartbeatsQueueName
  RECONCILE_QUEUE: reconcileQueueName
  RETENTION_DAYS: string(retentionDays)
  NOTIFICATIONS_TOPIC: notificationsTopicName
  STATE_TABLE_PREFIX: stateTablePrefix
  // The app's own master secret (contract §6); the relays never see it.
  APP_SECRET: '${kvRef}${secretNames.appSecret})'
  RELAY_CALLBACK_PORT: string(relayCallbackPort)
  ALLOWED_SUBSCRIPTIONS: join(allowedSubscriptions, ',')
  ATTESTATION_MODE: attestationMode
  RELAY_SILENT_AFTER_SECONDS: string(relaySilentAfterSeconds)
  APPROVAL_MARGIN_SECONDS: string(approvalMarginSeconds)
  PAGERDUTY_EVENTS_URL: pagerdutyEventsUrl
  EVENTGRID_QUEUE: eventGridQueueName
  APPROVERS: approvers
  PYTHON_THREADPOOL_THREAD_COUNT: string(pythonThreadCount)
}

var policyBaseSettings = {
  POLICY__DRY_RUN: policyDryRun ? 'true' : 'false'
  POLICY__WINDOWS: string(policyWindows)
  POLICY__TIMEZONE: policyTimezone
  POLICY__MAX_CONCURRENT_PER_SET: string(policyMaxConcurrentPerSet)
  POLICY__BUDGETS: string(policyBudgets)
}
var policyRulesSettings = empty(policyRules) ? {} : { POLICY__RULES: string(policyRules) }

var drainBaseSettings = {
  DRAIN__STEP_TIMEOUT_SECONDS: string(drainStepTimeoutSeconds)
  DRAIN__SAFETY_MARGIN_SECONDS: string(drainSafetyMarginSeconds)
  DRAIN__ON_FAILURE: drainOnFailure
  DRAIN__READINESS: (relayReadyPort > 0) ? 'true' : 'false'
}
var drainHttpSettings = empty(drainHttpUrl) ? {} : { DRAIN__HTTP_URL: drainHttpUrl }
var drainHookSettings = empty(drainRelayHook) ? {} : { DRAIN__RELAY_HOOK: drainRelayHook }
var undrainHttpSettings = empty(undrainHttpUrl) ? {} : { UNDRAIN__HTTP_URL: undrainHttpUrl }
var undrainHookSettings = empty(undrainRelayHook) ? {} : { UNDRAIN__RELAY_HOOK: undrainRelayHook }

// Never written here: RELAY_KEY / RELAY_KEY_PREVIOUS (no shared relay key any more) and
// ATTESTATION_CA_PEM (replaces the public roots that sign IMDS attested documents: the
// simulator's only, tests/infra/test_settings_contract.py keeps it out).

// PUBLIC_BASE_URL defaults, in the app, from WEBSITE_HOSTNAME (the real host name: a Flex
// app's is not NAME.azurewebsites.net); set it only for a custom domain.
var publicUrlSettings = empty(publicBaseUrl) ? {} : { PUBLIC_BASE_URL: publicBaseUrl }
var operatorsGroupSettings = empty(operatorsGroupId) ? {} : { OPERATORS_GROUP_ID: operatorsGroupId }
var operatorsRoleSettings = empty(operatorsAppRole) ? {} : { OPERATORS_APP_ROLE: operatorsAppRole }

// Channel secrets: only those that exist in the vault, always as references.
var pagerdutySettings = hasPagerduty ? { PAGERDUTY_ROUTING_KEY: '${kvRef}${secretNames.pagerdutyRoutingKey})' } : {}
var teamsSettings = hasTeams ? { TEAMS_WEBHOOK_URL: '${kvRef}${secretNames.teamsWebhookUrl})' } : {}
var slackSettings = hasSlack ? { SLACK_WEBHOOK_URL: '${kvRef}${secretNames.slackWebhookUrl})' } : {}
var webhookUrlSettings = hasWebhookUrl ? { WEBHOOK_URL: '${kvRef}${secretNames.webhookUrl})' } : {}
var webhookSecretSettings = hasWebhookSecret ? { WEBHOOK_SECRET: '${kvRef}${secretNames.webhookSecret})' } : {}
var appSecretPreviousSettings = hasAppSecretPrevious ? { APP_SECRET_PREVIOUS: '${kvRef}${secretNames.appSecretPrevious})' } : {}
var webhookSecretPreviousSettings = hasWebhookSecretPrevious ? { WEBHOOK_SECRET_PREVIOUS: '${kvRef}${secretNames.webhookSecretPrevious})' } : {}

// Every app setting, set when the site is created (Flex needs its storage settings from the start).
var appSettings = union(connectionSettings, bridgeSettings, publicUrlSettings, operatorsGroupSettings, operatorsRoleSettings, policyBaseSettings, policyRulesSettings, drainBaseSettings, drainHttpSettings, drainHookSettings, undrainHttpSettings, undrainHookSettings, pagerdutySettings, teamsSettings, slackSettings, webhookUrlSettings, webhookSecretSettings, appSecretPreviousSettings, webhookSecretPreviousSettings)

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  //checkov:skip=CKV_AZURE_225: Flex zone redundancy is regional and opt-in; enable it where your region offers it
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

resource site 'Microsoft.Web/sites@2024-04-01' = {
  //checkov:skip=CKV_AZURE_17: callers authenticate with function keys (manual approval, status); relays are never called through the app
  //checkov:skip=CKV_AZURE_222: operators reach the status and manual-approval functions over the internet with function keys
  //checkov:skip=CKV_AZURE_212: Flex Consumption scales from zero on demand; the documents queue buffers while an instance starts
  //checkov:skip=CKV_AZURE_213: health check is not available on Flex Consumption; the watchdog timer and Application Insights cover liveness
  //checkov:skip=CKV_AZURE_78: FTP is off through the ftp basicPublishingCredentialsPolicies (allow false); Flex Consumption deprecates siteConfig.ftpsState (ARM error 51021)
  name: name
  location: location
  tags: tags
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    publicNetworkAccess: 'Enabled'
    virtualNetworkSubnetId: functionSubnetId
    keyVaultReferenceIdentity: identityId
    siteConfig: {
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      // No ftpsState: Flex Consumption lists it among its deprecated site properties and ARM
      // has refused it there (error 51021); FTP is off through the ftp publishing policy below.
      // https://learn.microsoft.com/azure/azure-functions/functions-app-settings#flex-consumption-plan-deprecations
      http20Enabled: true
      appSettings: [
        for setting in items(appSettings): {
          name: setting.key
          value: setting.value
        }
      ]
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: deploymentContainerUrl
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
        alwaysReady: concat((ingestAlwaysReady > 0) ? ingestReady : [], (reconcileAlwaysReady > 0) ? reconcileReady : [])
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
  }
}

// No FTP, no basic-auth SCM publishing: deploy with Entra ID (func publish / az zip deploy).
resource ftpCredentials 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmCredentials 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'scm'
  properties: {
    allow: false
  }
}

// Sign-in for the operators' pages. Anonymous requests still reach the app (the function-key
// APIs, the triggers' webhooks); the pages themselves send a visitor who is not signed in to
// /.auth/login/aad and admit only OPERATORS_GROUP_ID / OPERATORS_APP_ROLE. With this on, App
// Service sets WEBSITE_AUTH_ENABLED and strips any X-MS-CLIENT-PRINCIPAL* header a client
// sends, which is what lets the app trust the one it receives.
resource authSettings 'Microsoft.Web/sites/config@2024-04-01' = if (!empty(operatorsClientId)) {
  //checkov:skip=CKV_AZURE_13: this resource is App Service Authentication itself (authsettingsV2, platform enabled); checkov reads it as a web config
  //checkov:skip=CKV_AZURE_63: sign-in settings, not the web config; the app logs to Application Insights (site resource)
  //checkov:skip=CKV_AZURE_65: sign-in settings, not the web config; detailed errors stay off on the site
  //checkov:skip=CKV_AZURE_66: sign-in settings, not the web config; invocations are traced in Application Insights
  //checkov:skip=CKV_AZURE_80: sign-in settings of a Python app: no .NET Framework is involved
  //checkov:skip=CKV_AZURE_88: sign-in settings: no file storage; the Flex app deploys from a blob container
  //checkov:skip=CKV_AZURE_222: operators reach the approval pages over the internet, signed in with Entra ID
  parent: site
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: false
      unauthenticatedClientAction: 'AllowAnonymous'
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: operatorsClientId
          openIdIssuer: '${environment().authentication.loginEndpoint}${operatorsTenantId}/v2.0'
        }
        validation: {
          allowedAudiences: [
            operatorsClientId
            'api://${operatorsClientId}'
          ]
        }
      }
    }
    login: {
      tokenStore: {
        enabled: false
      }
      cookieExpiration: {
        convention: 'FixedTime'
        timeToExpiration: '08:00:00'
      }
      nonce: {
        validateNonce: true
      }
    }
    httpSettings: {
      requireHttps: true
    }
  }
}

output name string = site.name
output defaultHostName string = site.properties.defaultHostName
output url string = 'https://${site.properties.defaultHostName}'
