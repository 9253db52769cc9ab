"""Per-VM identity (issue 22): what the app believes about who sent a message.

Trust model. Service Bus tells a receiver nothing about the sender, and anything on a VM can
read its own vmId or claim any name, so the app believes only what Azure itself vouches for:

- attestation: every message carries an IMDS attested document whose nonce is a hash of the
  message. Azure signs it with a `metadata.azure.com` (+ `<region>.metadata.azure.com`)
  certificate chaining to a root shipped in identity/trust, and only for the VM that asks,
  so the signature proves "VM <vmId> sent exactly these bytes, recently". A compromised VM
  can attest only its own messages.
- facts: the VM's name, sets and private address come from Azure Resource Graph by that
  vmId, never from the envelope's claims. A VM therefore speaks only about itself and the
  app calls back only to the address Azure gave it.
- keys: the relay's callback secret arrives inside attested messages (so it belongs to that
  vmId), is stored wrapped under the app's own APP_SECRET, and signs callbacks naming the
  target vmId, so a callback for one VM is useless against another.
- registry: these facts and keys live in a table only the app writes; relays write nothing
  the app reads as truth (their liveness rows are signed hints).

Modules: attestation (checks 1-6 of contract §1; pkcs7, issuers, trust and
attestation_errors are its parts, check_cli its operator command), facts (Resource Graph
resolver), keys (callback keys, wrapping, derived keys), registry (the identities
table). No module here imports functions.pipeline, so the pipeline may import all of them.
"""
