// The SSH key an example machine needs, checked on its own (main.bicep deploys this module only
// with deployExampleScaleSet or deployExampleVm on). It creates nothing and waits for nothing, so
// an empty key fails it, naming adminSshPublicKey, before the example machines are deployed.

@description('SSH public key for the example VMs (password login is off): required while an example machine is deployed. Export SSH_PUBLIC_KEY (infra/main.bicepparam reads it), or turn the examples off.')
@minLength(1)
param adminSshPublicKey string

output keyGiven bool = !empty(adminSshPublicKey)
