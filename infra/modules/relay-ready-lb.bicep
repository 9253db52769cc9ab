// Example (issue 33): an internal Standard load balancer in front of relay VMs whose health
// probe is the relay's readiness probe, `GET /readyz` on port 8493, which add-relay.sh and
// cloud-init install by default: answered by the readiness responder on a port systemd
// holds, so the relay being down, restarting or removed never fails it (docs/readiness.md,
// issue 44). It answers 503 from the moment the bridge starts draining the VM (its drain hook)
// until the undrain hook has run, so the load balancer stops sending new flows to a VM
// about to be rebooted, redeployed, evicted or deleted, and sends them again once back.
// main.bicep deploys it in front of the example scale set (deployExampleScaleSet, with
// relayReadyPort on); for your own VMs, deploy it into their resource group and put their
// NICs (ipConfigurations[].properties.loadBalancerBackendAddressPools) or scale set
// (networkProfile) in `backendPoolId`.
//
// Azure's probes come from 168.63.129.16 (service tag AzureLoadBalancer) to the VM's own
// address: the relay must listen there (0.0.0.0 or the NIC's address, never 127.0.0.1), and
// the NSG must let AzureLoadBalancer in on that port (the default rule
// AllowAzureLoadBalancerInBound does, unless a rule of yours denies it first).

param name string

param location string

param tags object = {}

@description('Resource id of the subnet of the VMs (the frontend address comes from it).')
param subnetId string

@description('The relays\' readiness port (scheduled-events-relay-ready.socket, add-relay.sh\'s 9th argument).')
@minValue(1)
@maxValue(65535)
param readyPort int = 8493

@description('The port your application serves on the VMs (and on the frontend).')
@minValue(1)
@maxValue(65535)
param appPort int = 443

@description('Seconds between probes; a VM is out after probeThreshold failures in a row.')
@minValue(5)
param probeIntervalSeconds int = 5

@minValue(1)
param probeThreshold int = 2

var frontendName = 'frontend'
var poolName = 'relay-vms'
var probeName = 'relay-readyz'

resource loadBalancer 'Microsoft.Network/loadBalancers@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: {
    name: 'Standard'
    tier: 'Regional'
  }
  properties: {
    frontendIPConfigurations: [
      {
        name: frontendName
        properties: {
          privateIPAllocationMethod: 'Dynamic'
          subnet: {
            id: subnetId
          }
        }
      }
    ]
    backendAddressPools: [
      {
        name: poolName
      }
    ]
    probes: [
      {
        name: probeName
        properties: {
          protocol: 'Http'
          port: readyPort
          requestPath: '/readyz'
          intervalInSeconds: probeIntervalSeconds
          numberOfProbes: probeThreshold
          probeThreshold: probeThreshold
        }
      }
    ]
    loadBalancingRules: [
      {
        name: 'app'
        properties: {
          frontendIPConfiguration: {
            id: resourceId('Microsoft.Network/loadBalancers/frontendIPConfigurations', name, frontendName)
          }
          backendAddressPool: {
            id: resourceId('Microsoft.Network/loadBalancers/backendAddressPools', name, poolName)
          }
          probe: {
            id: resourceId('Microsoft.Network/loadBalancers/probes', name, probeName)
          }
          protocol: 'Tcp'
          frontendPort: appPort
          backendPort: appPort
          enableTcpReset: true
          idleTimeoutInMinutes: 4
          disableOutboundSnat: true
          loadDistribution: 'Default'
        }
      }
    ]
  }
}

@description('Put the VMs\' NIC ipConfigurations (or the scale set\'s) in this pool.')
output backendPoolId string = resourceId('Microsoft.Network/loadBalancers/backendAddressPools', name, poolName)

output name string = loadBalancer.name
