"""The pages run against the same fixtures as the pipeline tests: Azurite, a fake clock,
relays that check signatures."""

from tests.functions.conftest import clock, new_relay, relay, store  # noqa: F401
