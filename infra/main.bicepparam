// Worked example: a new VNet, the bridge, and one example scale set running the relay.
//
//   export APP_SECRET=$(openssl rand -hex 32)         # the app's own secret (Key Vault); relays never see it
//   export SSH_PUBLIC_KEY="$(cat ~/.ssh/id_ed25519.pub)"  # only with the example scale set
//   .venv/bin/python -m functions settings check --file infra/main.bicepparam   # offline, first
//   az deployment group create -g rg-sebridge -f infra/main.bicep -p infra/main.bicepparam
//
// Secrets come from environment variables, never from this file.
using 'main.bicep'

param prefix = 'sebridge'

// Service Bus: Standard, Entra ID only (no SAS keys), resends dropped for an hour.
param serviceBusSku = 'Standard'
param allowServiceBusSasAuth = false
param duplicateDetectionWindow = 'PT1H'
param maxDeliveryCount = 10

// Network: a new VNet; the function subnet alone may reach relay callbacks on port 8492.
param createVirtualNetwork = true
param vnetAddressPrefix = '10.40.0.0/16'
param vmSubnetPrefix = '10.40.0.0/24'
param functionSubnetPrefix = '10.40.1.0/24'
param relayCallbackPort = 8492

// Secrets, stored in Key Vault; an empty value leaves that channel off.
param appSecret = readEnvironmentVariable('APP_SECRET')
param pagerdutyRoutingKey = readEnvironmentVariable('PAGERDUTY_ROUTING_KEY', '')
param teamsWebhookUrl = readEnvironmentVariable('TEAMS_WEBHOOK_URL', '')
param slackWebhookUrl = readEnvironmentVariable('SLACK_WEBHOOK_URL', '')
param webhookUrl = readEnvironmentVariable('WEBHOOK_URL', '')
param webhookSecret = readEnvironmentVariable('WEBHOOK_SECRET', '')
// Only during a rotation: the values the two above replace (see the README).
param appSecretPrevious = readEnvironmentVariable('APP_SECRET_PREVIOUS', '')
param webhookSecretPrevious = readEnvironmentVariable('WEBHOOK_SECRET_PREVIOUS', '')

// Policy: the default (empty rules): drain, then approve, every disruptive event, Platform
// or User; a short Freeze approved at once; a VM with no working drain gets Microsoft's
// sample (Platform events held to NotBefore, User events approved at once). No dry run, no
// maintenance windows, at most one impactful event approved at a time per scale set /
// availability set, and no disruption budgets beyond that one (docs/policy.md).
param policyRules = []
param policyDryRun = false
param policyWindows = []
param policyTimezone = 'UTC'
param policyMaxConcurrentPerSet = 1
param policyBudgets = []

// Drain workflow: if a drain step fails, hold and let NotBefore arrive. Without a drain step
// of yours (SEBRIDGE_DRAIN_HTTP_URL or SEBRIDGE_DRAIN_RELAY_HOOK) each VM's readiness probe
// turns 503 (its load balancer takes it out), then 30 s, then approve.
param drainOnFailure = 'hold'
param drainHttpUrl = readEnvironmentVariable('SEBRIDGE_DRAIN_HTTP_URL', '')
param drainRelayHook = readEnvironmentVariable('SEBRIDGE_DRAIN_RELAY_HOOK', '')

// Who hears the alerts when the bridge is down: an e-mail address and/or an existing action
// group's resource id. With neither, the alertReceivers output says NONE.
param alertEmail = readEnvironmentVariable('ALERT_EMAIL', '')
param alertActionGroupId = readEnvironmentVariable('ALERT_ACTION_GROUP_ID', '')

// Example scale set: two Standard_B2s instances running the relay (README: what a deploy
// creates, and its cost), ten minutes to drain before a deletion proceeds. false: none, and
// no SSH key is asked for.
param deployExampleScaleSet = true
param deployExampleVm = false
param exampleInstanceCount = 2
param terminateNotBeforeTimeout = 'PT10M'
// Asked for only while an example is on (above): `settings check --file` says so offline.
param adminSshPublicKey = readEnvironmentVariable('SSH_PUBLIC_KEY', '')
// Empty: cloud-init installs the relay embedded in customData (infra/relay/). Or a release
// asset with its checksum: https://.../scheduled-events-relay.pyz#sha256=HEX
param relayPackageUrl = readEnvironmentVariable('RELAY_PACKAGE_URL', '')
// Agentless mode (enableEventGrid, preview): the Maintenance resource provider's object id
// in your tenant (infra/README.md, "Agentless mode"); empty leaves its role unassigned.
param maintenanceProviderPrincipalId = readEnvironmentVariable('MAINTENANCE_RP_PRINCIPAL_ID', '')
