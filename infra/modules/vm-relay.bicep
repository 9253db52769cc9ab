// Example: one Linux VM running the relay (installed by cloud-init). Same as the scale-set
// example minus Terminate notifications, which exist for scale sets only.

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

resource nic 'Microsoft.Network/networkInterfaces@2024-01-01' = {
  name: '${name}-nic'
  location: location
  tags: tags
  properties: {
    ipConfigurations: [
      {
        name: 'ipconfig'
        properties: {
          privateIPAllocationMethod: 'Dynamic'
          subnet: {
            id: subnetId
          }
        }
      }
    ]
  }
}

@description('Publish this VM\'s Scheduled Events to Event Grid and Resource Graph (agentless mode, preview: register Microsoft.Compute/SendScheduledEventsPolicy).')
param eventGridOptIn bool = false

var eventGridPolicy = {
  scheduledEventsAdditionalPublishingTargets: {
    eventGridAndResourceGraph: {
      enable: true
      scheduledEventsApiVersion: '2020-07-01'
    }
  }
}

resource vm 'Microsoft.Compute/virtualMachines@2025-04-01' = {
  //checkov:skip=CKV_AZURE_97: encryption at host needs the EncryptionAtHost feature registered on the subscription; enable it in securityProfile once registered
  //checkov:skip=CKV_AZURE_151: encryption at host needs the EncryptionAtHost feature registered on the subscription; enable it in securityProfile once registered
  name: name
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${relayIdentityId}': {}
    }
  }
  properties: {
    scheduledEventsPolicy: eventGridOptIn ? eventGridPolicy : null
    hardwareProfile: {
      vmSize: vmSize
    }
    osProfile: {
      computerName: take(name, 15)
      adminUsername: adminUsername
      customData: base64(customData)
      allowExtensionOperations: false
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
      networkInterfaces: [
        {
          id: nic.id
        }
      ]
    }
  }
}

output name string = vm.name
