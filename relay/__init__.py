"""The on-VM relay: polls IMDS, forwards every changed document, approves on a signed call."""

__version__ = "0.1.0"
