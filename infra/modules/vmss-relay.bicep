// Example: a Linux scale set whose instances run the relay (installed by cloud-init) and get
// Terminate notifications, so the bridge can drain an instance before it is deleted; behind an
// internal load balancer whose probe is each relay's /readyz (main.bicep, relay-ready-lb.bicep).

param name string

param location string

param tags object = {}

@description('Resource id of the VM subnet (the NSG there keeps the callback port private).')
param subnetId string

@description('Resource id of the relays\' user-assigned managed identity.')
param relayIdentityId string

@description('cloud-init that installs and starts the relay (main.bicep renders it).')
param customData string

param adminUsername string = 'azureuser'

@description('SSH public key for adminUsername; password login is disabled.')
@minLength(1)
param adminSshPublicKey string

param vmSize string = 'Standard_B2s'

@minValue(0)
@maxValue(100)
param instanceCount int = 2

@description('How long a deletion waits for approval (Terminate NotBefore): 5 to 15 minutes.')
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

@description('A load balancer backend pool (relay-ready-lb.bicep) whose probe is the relays\' /readyz; empty: none.')
param loadBalancerBackendPoolId string = ''

@description('Publish this scale set\'s Scheduled Events to Event Grid and Resource Graph (agentless mode, preview: register Microsoft.Compute/SendScheduledEventsPolicy).')
param eventGridOptIn bool = false

var backendPool = [
  {
    id: loadBalancerBackendPoolId
  }
]

var eventGridPolicy = {
  scheduledEventsAdditionalPublishingTargets: {
    eventGridAndResourceGraph: {
      enable: true
      scheduledEventsApiVersion: '2020-07-01'
    }
  }
}

resource scaleSet 'Microsoft.Compute/virtualMachineScaleSets@2025-04-01' = {
  //checkov:skip=CKV_AZURE_95: automatic OS image upgrades reimage instances and need a health probe; this example keeps Manual upgrades
  //checkov:skip=CKV_AZURE_97: encryption at host needs the EncryptionAtHost feature registered on the subscription; enable it in securityProfile once registered
  name: name
  location: location
  tags: tags
  sku: {
    name: vmSize
    tier: 'Standard'
    capacity: instanceCount
  }
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${relayIdentityId}': {}
    }
  }
  properties: {
    scheduledEventsPolicy: eventGridOptIn ? eventGridPolicy : null
    orchestrationMode: 'Uniform'
    overprovision: false
    upgradePolicy: {
      mode: 'Manual'
    }
    virtualMachineProfile: {
      scheduledEventsProfile: {
        terminateNotificationProfile: {
          enable: true
          notBeforeTimeout: terminateNotBeforeTimeout
        }
      }
      osProfile: {
        computerNamePrefix: take(name, 9)
        adminUsername: adminUsername
        customData: base64(customData)
        linuxConfiguration: {
          disablePasswordAuthentication: true
          provisionVMAgent: true
          ssh: {
            publicKeys: [
              {
                path: '/home/${adminUsername}/.ssh/authorized_keys'
                keyData: adminSshPublicKey
              }
            ]
          }
        }
      }
      storageProfile: {
        imageReference: {
          publisher: 'Canonical'
          offer: 'ubuntu-24_04-lts'
          sku: 'server'
          version: 'latest'
        }
        osDisk: {
          createOption: 'FromImage'
          caching: 'ReadWrite'
          managedDisk: {
            storageAccountType: 'StandardSSD_LRS'
          }
        }
      }
      networkProfile: {
        networkInterfaceConfigurations: [
          {
            name: 'nic'
            properties: {
              primary: true
              ipConfigurations: [
                {
                  name: 'ipconfig'
                  properties: {
                    subnet: {
                      id: subnetId
                    }
                    loadBalancerBackendAddressPools: empty(loadBalancerBackendPoolId) ? [] : backendPool
                  }
                }
              ]
            }
          }
        ]
      }
    }
  }
}

output name string = scaleSet.name
