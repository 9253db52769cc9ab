// Key Vault (RBAC mode) for every secret the bridge uses. A channel secret is created only
// when its value is given; the function app's identity gets Key Vault Secrets User on each
// of its secrets, never on the vault. The relays hold no role here: there is no shared relay
// key any more (each relay makes its own callback key, contract §4).

@description('Key Vault name: 3-24 letters, digits and hyphens, globally unique.')
@minLength(3)
@maxLength(24)
param vaultName string

param location string

param tags object = {}

// Purge protection keeps a deleted vault (and its name) for softDeleteRetentionInDays: a
// vault of the same name cannot be created meanwhile. After deleting and recreating the
// resource group, either recover the old vault (createMode 'recover': same name, same
// group, its secrets are then rewritten by this deployment) or choose a new name
// (main.bicep's keyVaultNameSeed).
@description('default: create (or update) the vault. recover: recover the soft-deleted vault of this name.')
@allowed([
  'default'
  'recover'
])
param createMode string = 'default'

@description('The app\'s own master secret (at least 32 characters): wraps the relays\' stored callback keys and keys the approval page tokens. Stored as secret `app-secret`; never leaves the app.')
@secure()
@minLength(32)
param appSecret string

@description('PagerDuty Events API v2 routing key; empty = no PagerDuty channel.')
@secure()
param pagerdutyRoutingKey string = ''

@description('Teams incoming-webhook / workflow URL (it embeds a token); empty = no Teams channel.')
@secure()
param teamsWebhookUrl string = ''

@description('Slack incoming-webhook URL (https://hooks.slack.com/services/..., it embeds a token); empty = no Slack channel.')
@secure()
param slackWebhookUrl string = ''

@description('Generic webhook URL; empty = no webhook channel.')
@secure()
param webhookUrl string = ''

@description('Key that signs webhook requests; empty = unsigned (not recommended).')
@secure()
param webhookSecret string = ''

@description('During a rotation: the app secret appSecret replaces (APP_SECRET_PREVIOUS); empty = none.')
@secure()
param appSecretPrevious string = ''

@description('During a rotation: the webhook secret webhookSecret replaces (WEBHOOK_SECRET_PREVIOUS); empty = none.')
@secure()
param webhookSecretPrevious string = ''

@description('Principal (object) id of the function app\'s managed identity.')
param functionPrincipalId string

@description('Subnets (with the Microsoft.KeyVault service endpoint) allowed through the vault firewall: the function subnet (relays read nothing here).')
param allowedSubnetIds array = []

@description('Firewall default for everything else. Deny keeps the vault reachable only from allowedSubnetIds and trusted Azure services.')
@allowed([
  'Allow'
  'Deny'
])
param networkDefaultAction string = 'Deny'

// Built-in role: Key Vault Secrets User (read secret values).
var keyVaultSecretsUser = '4633458b-17de-408a-b874-0445c86b69e6'

// Secret names; the function app's settings reference them by these names.
var names = {
  appSecret: 'app-secret'
  pagerdutyRoutingKey: 'pagerduty-routing-key'
  teamsWebhookUrl: 'teams-webhook-url'
  slackWebhookUrl: 'slack-webhook-url'
  webhookUrl: 'webhook-url'
  webhookSecret: 'webhook-secret'
  appSecretPrevious: 'app-secret-previous'
  webhookSecretPrevious: 'webhook-secret-previous'
}

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  //checkov:skip=CKV_AZURE_189: the Flex app reads its secrets through the firewall (networkAcls, its subnet's service endpoint); private endpoints are outside this example
  name: vaultName
  location: location
  tags: tags
  properties: {
    createMode: createMode
    tenantId: subscription().tenantId
    sku: {
      family: 'A'
      name: 'standard'
    }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 90
    enablePurgeProtection: true
    enabledForDeployment: false
    enabledForDiskEncryption: false
    enabledForTemplateDeployment: false
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: networkDefaultAction
      ipRules: []
      virtualNetworkRules: [
        for id in allowedSubnetIds: {
          id: id
          ignoreMissingVnetServiceEndpoint: false
        }
      ]
    }
  }
}

resource appSecretSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = {
  //checkov:skip=CKV_AZURE_41: rotation is operator-driven (README); an expiry date would silently stop the app from opening the relays' stored keys
  parent: vault
  name: names.appSecret
  properties: {
    value: appSecret
    contentType: 'text/plain'
  }
}

resource pagerdutySecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(pagerdutyRoutingKey)) {
  //checkov:skip=CKV_AZURE_114: contentType is set below; checkov does not read the body of a conditional (if) resource
  //checkov:skip=CKV_AZURE_41: set by the channel's owner; an expiry would silently mute the channel
  parent: vault
  name: names.pagerdutyRoutingKey
  properties: {
    value: pagerdutyRoutingKey
    contentType: 'text/plain'
  }
}

resource teamsSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(teamsWebhookUrl)) {
  //checkov:skip=CKV_AZURE_114: contentType is set below; checkov does not read the body of a conditional (if) resource
  //checkov:skip=CKV_AZURE_41: set by the channel's owner; an expiry would silently mute the channel
  parent: vault
  name: names.teamsWebhookUrl
  properties: {
    value: teamsWebhookUrl
    contentType: 'text/uri'
  }
}

resource slackSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(slackWebhookUrl)) {
  //checkov:skip=CKV_AZURE_114: contentType is set below; checkov does not read the body of a conditional (if) resource
  //checkov:skip=CKV_AZURE_41: set by the channel's owner; an expiry would silently mute the channel
  parent: vault
  name: names.slackWebhookUrl
  properties: {
    value: slackWebhookUrl
    contentType: 'text/uri'
  }
}

resource webhookUrlSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(webhookUrl)) {
  //checkov:skip=CKV_AZURE_114: contentType is set below; checkov does not read the body of a conditional (if) resource
  //checkov:skip=CKV_AZURE_41: set by the channel's owner; an expiry would silently mute the channel
  parent: vault
  name: names.webhookUrl
  properties: {
    value: webhookUrl
    contentType: 'text/uri'
  }
}

resource webhookSecretSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(webhookSecret)) {
  //checkov:skip=CKV_AZURE_114: contentType is set below; checkov does not read the body of a conditional (if) resource
  //checkov:skip=CKV_AZURE_41: set by the channel's owner; an expiry would silently break webhook signatures
  parent: vault
  name: names.webhookSecret
  properties: {
    value: webhookSecret
    contentType: 'text/plain'
  }
}

resource appSecretPreviousSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(appSecretPrevious)) {
  //checkov:skip=CKV_AZURE_114: contentType is set below; checkov does not read the body of a conditional (if) resource
  //checkov:skip=CKV_AZURE_41: kept only during a rotation, removed by the operator (README)
  parent: vault
  name: names.appSecretPrevious
  properties: {
    value: appSecretPrevious
    contentType: 'text/plain'
  }
}

resource webhookSecretPreviousSecret 'Microsoft.KeyVault/vaults/secrets@2023-07-01' = if (!empty(webhookSecretPrevious)) {
  //checkov:skip=CKV_AZURE_114: contentType is set below; checkov does not read the body of a conditional (if) resource
  //checkov:skip=CKV_AZURE_41: kept only during a rotation, removed by the operator (README)
  parent: vault
  name: names.webhookSecretPrevious
  properties: {
    value: webhookSecretPrevious
    contentType: 'text/plain'
  }
}

// The function app reads each of its secrets (Key Vault references in its app settings);
// no other identity reads anything here.
resource functionReadsAppSecret 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: appSecretSecret
  name: guid(appSecretSecret.id, functionPrincipalId, keyVaultSecretsUser)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionReadsPagerduty 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(pagerdutyRoutingKey)) {
  scope: pagerdutySecret
  name: guid(vault.id, names.pagerdutyRoutingKey, functionPrincipalId, keyVaultSecretsUser)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionReadsTeams 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(teamsWebhookUrl)) {
  scope: teamsSecret
  name: guid(vault.id, names.teamsWebhookUrl, functionPrincipalId, keyVaultSecretsUser)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionReadsSlack 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(slackWebhookUrl)) {
  scope: slackSecret
  name: guid(vault.id, names.slackWebhookUrl, functionPrincipalId, keyVaultSecretsUser)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionReadsWebhookUrl 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(webhookUrl)) {
  scope: webhookUrlSecret
  name: guid(vault.id, names.webhookUrl, functionPrincipalId, keyVaultSecretsUser)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionReadsWebhookSecret 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(webhookSecret)) {
  scope: webhookSecretSecret
  name: guid(vault.id, names.webhookSecret, functionPrincipalId, keyVaultSecretsUser)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionReadsAppSecretPrevious 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(appSecretPrevious)) {
  scope: appSecretPreviousSecret
  name: guid(vault.id, names.appSecretPrevious, functionPrincipalId, keyVaultSecretsUser)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

resource functionReadsWebhookSecretPrevious 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(webhookSecretPrevious)) {
  scope: webhookSecretPreviousSecret
  name: guid(vault.id, names.webhookSecretPrevious, functionPrincipalId, keyVaultSecretsUser)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', keyVaultSecretsUser)
    principalId: functionPrincipalId
    principalType: 'ServicePrincipal'
  }
}

output vaultName string = vault.name
output vaultUri string = vault.properties.vaultUri
// Which optional secrets exist, so the app settings reference only those.
output hasPagerduty bool = !empty(pagerdutyRoutingKey)
output hasTeams bool = !empty(teamsWebhookUrl)
output hasSlack bool = !empty(slackWebhookUrl)
output hasWebhookUrl bool = !empty(webhookUrl)
output hasWebhookSecret bool = !empty(webhookSecret)
output hasAppSecretPrevious bool = !empty(appSecretPrevious)
output hasWebhookSecretPrevious bool = !empty(webhookSecretPrevious)
output secretNames object = names
