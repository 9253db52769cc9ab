"""Rolling the relay out, upgrading, rolling back and removing it across a fleet
(`python -m functions relay ...`, docs/rollout.md): managed Run Command on each VM, in
batches no larger than the policy's disruption budgets allow, each batch waiting for its
relays' heartbeats from the new version before the next starts."""
