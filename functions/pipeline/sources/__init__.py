"""Where events come from besides the relays' envelopes: Event Grid (agentless mode)."""
