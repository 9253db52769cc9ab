"""Running the bridge on one machine, never published: the local functions host (an inbox
directory instead of Service Bus, Azurite for tables), local receivers for the channels,
and `python -m local.demo`, the rehearsal `make demo` runs."""
