"""The function-app fixtures (Azurite store, fake clock, signature-checking relays)."""

from tests.functions.conftest import clock, new_relay, relay, store  # noqa: F401
