"""The on-VM relay: polls IMDS, forwards every changed document, approves on a signed call."""

__version__ = "0.2.0"
# The relay<->app contract this relay speaks (its liveness rows, docs/contract.md §5): 2 since
# 0.2.0 (signed `contract`, `probe_at`, `drain`); relays 0.1.x speak 1.
CONTRACT = 2
