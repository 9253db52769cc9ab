// Networking: the function app joins the VMs' virtual network through its own delegated
// subnet (so it can reach relay callbacks on private IPs), and an NSG lets only that subnet
// reach the relay's callback port on the VM subnet.
//
// Two modes: create a new VNet with both subnets (createVirtualNetwork = true), or add the
// function subnet to an existing VNet and put the callback rules into an existing NSG (or a
// new one you attach to the VM subnet yourself, see the README).

param location string

param tags object = {}

@description('true: create the VNet with a VM subnet and a function subnet. false: use an existing VNet.')
param createVirtualNetwork bool = true

@description('Name of the VNet (created, or existing in this resource group).')
param virtualNetworkName string

@description('Address space of a new VNet.')
param addressPrefix string = '10.40.0.0/16'

@description('New VNet only: attach a NAT gateway to both subnets for explicit outbound internet access.')
param createNatGateway bool = true

param natGatewayName string = 'ng-sebridge'

@description('Name of the VM subnet (created in a new VNet, or the existing one your VMs use).')
param vmSubnetName string = 'snet-vms'

@description('Prefix of a new VM subnet (ignored for an existing VNet).')
param vmSubnetPrefix string = '10.40.0.0/24'

@description('Name of the subnet delegated to the function app (always created).')
param functionSubnetName string = 'snet-functions'

@description('Prefix of the function subnet; the only source allowed to reach the relay callback port.')
param functionSubnetPrefix string = '10.40.1.0/24'

@description('TCP port the relay listens on for signed callbacks.')
@minValue(1024)
@maxValue(65535)
param callbackPort int = 8492

@description('The relays\' readiness probe port (GET /readyz; 0: none): in the NSG this template creates, open to Azure Load Balancer\'s probes and closed to every other source.')
@minValue(0)
@maxValue(65535)
param readyPort int = 0

@description('Name of the NSG this template creates for the VM subnet (when existingNsgName is empty).')
param nsgName string

@description('An NSG already attached to your VM subnet: the callback rules are added to it instead.')
param existingNsgName string = ''

// The callback port: open to the function subnet, closed to everything else, including the
// rest of the VNet (the default AllowVnetInBound rule sits at 65000, below these).
var callbackRules = [
  {
    name: 'allow-relay-callback-from-functions'
    properties: {
      description: 'Relay callback: only the function app subnet may call it'
      priority: 200
      direction: 'Inbound'
      access: 'Allow'
      protocol: 'Tcp'
      sourceAddressPrefix: functionSubnetPrefix
      sourcePortRange: '*'
      destinationAddressPrefix: 'VirtualNetwork'
      destinationPortRange: string(callbackPort)
    }
  }
  {
    name: 'deny-relay-callback-from-others'
    properties: {
      description: 'Relay callback: closed to every other source'
      priority: 210
      direction: 'Inbound'
      access: 'Deny'
      protocol: '*'
      sourceAddressPrefix: '*'
      sourcePortRange: '*'
      destinationAddressPrefix: '*'
      destinationPortRange: string(callbackPort)
    }
  }
]

// The readiness probe (issue 38): Azure Load Balancer probes from 168.63.129.16, the service
// tag AzureLoadBalancer, to the VM's own address; nothing else needs /readyz. Only in the NSG
// this template creates: in yours, AllowAzureLoadBalancerInBound (65001) already lets the
// probe in, and an Application Gateway's probes would come from its own subnet instead.
var readyRules = [
  {
    name: 'allow-relay-readyz-from-load-balancer'
    properties: {
      description: 'Relay readiness probe: Azure Load Balancer probes only'
      priority: 220
      direction: 'Inbound'
      access: 'Allow'
      protocol: 'Tcp'
      sourceAddressPrefix: 'AzureLoadBalancer'
      sourcePortRange: '*'
      destinationAddressPrefix: 'VirtualNetwork'
      destinationPortRange: string(readyPort)
    }
  }
  {
    name: 'deny-relay-readyz-from-others'
    properties: {
      description: 'Relay readiness probe: closed to every other source'
      priority: 230
      direction: 'Inbound'
      access: 'Deny'
      protocol: '*'
      sourceAddressPrefix: '*'
      sourcePortRange: '*'
      destinationAddressPrefix: '*'
      destinationPortRange: string(readyPort)
    }
  }
]

// The NSG the VM subnet uses: ours, or yours with our two rules added.
var nsgId = empty(existingNsgName) ? nsg.id : existingNsg.id

var keyVaultServiceEndpoint = [
  {
    service: 'Microsoft.KeyVault'
  }
]

var flexDelegation = [
  {
    name: 'flex-consumption'
    properties: {
      serviceName: 'Microsoft.App/environments'
    }
  }
]

resource nsg 'Microsoft.Network/networkSecurityGroups@2024-01-01' = if (empty(existingNsgName)) {
  name: nsgName
  location: location
  tags: tags
  properties: {
    securityRules: (readyPort > 0) ? concat(callbackRules, readyRules) : callbackRules
  }
}

resource existingNsg 'Microsoft.Network/networkSecurityGroups@2024-01-01' existing = if (!empty(existingNsgName)) {
  name: existingNsgName
}

resource existingNsgAllowRule 'Microsoft.Network/networkSecurityGroups/securityRules@2024-01-01' = if (!empty(existingNsgName)) {
  parent: existingNsg
  name: callbackRules[0].name
  properties: callbackRules[0].properties
}

resource existingNsgDenyRule 'Microsoft.Network/networkSecurityGroups/securityRules@2024-01-01' = if (!empty(existingNsgName)) {
  parent: existingNsg
  name: callbackRules[1].name
  properties: callbackRules[1].properties
}

resource vnet 'Microsoft.Network/virtualNetworks@2024-01-01' = if (createVirtualNetwork) {
  name: virtualNetworkName
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    subnets: [
      {
        name: vmSubnetName
        properties: {
          addressPrefix: vmSubnetPrefix
          networkSecurityGroup: {
            id: nsgId
          }
          // No Key Vault endpoint: relays read nothing in the vault (per-VM keys, contract §4).
          natGateway: natGatewayRef
        }
      }
      {
        name: functionSubnetName
        properties: {
          addressPrefix: functionSubnetPrefix
          delegations: flexDelegation
          serviceEndpoints: keyVaultServiceEndpoint
          natGateway: natGatewayRef
        }
      }
    ]
  }
}

var natGatewayEnabled = createVirtualNetwork && createNatGateway

resource natPublicIp 'Microsoft.Network/publicIPAddresses@2024-01-01' = if (natGatewayEnabled) {
  name: '${natGatewayName}-pip'
  location: location
  tags: tags
  sku: {
    name: 'Standard'
  }
  properties: {
    publicIPAllocationMethod: 'Static'
    publicIPAddressVersion: 'IPv4'
  }
}

resource natGateway 'Microsoft.Network/natGateways@2024-01-01' = if (natGatewayEnabled) {
  name: natGatewayName
  location: location
  tags: tags
  sku: {
    name: 'Standard'
  }
  properties: {
    idleTimeoutInMinutes: 4
    publicIpAddresses: [
      {
        id: natPublicIp.id
      }
    ]
  }
}

var natGatewayRef = natGatewayEnabled ? { id: natGateway.id } : null

resource existingVnet 'Microsoft.Network/virtualNetworks@2024-01-01' existing = if (!createVirtualNetwork) {
  name: virtualNetworkName
}

resource addedFunctionSubnet 'Microsoft.Network/virtualNetworks/subnets@2024-01-01' = if (!createVirtualNetwork) {
  parent: existingVnet
  name: functionSubnetName
  properties: {
    addressPrefix: functionSubnetPrefix
    delegations: flexDelegation
    serviceEndpoints: keyVaultServiceEndpoint
  }
}

// Ids by name (no reference to a resource that may not be deployed in this mode); a
// module's outputs are read only after all of its resources exist.
output vmSubnetId string = resourceId('Microsoft.Network/virtualNetworks/subnets', virtualNetworkName, vmSubnetName)
output functionSubnetId string = resourceId('Microsoft.Network/virtualNetworks/subnets', virtualNetworkName, functionSubnetName)
output functionSubnetPrefix string = functionSubnetPrefix
output nsgId string = nsgId
output callbackPort int = callbackPort
