"""Policy backtest: replay real maintenance history through a candidate policy.

`python -m functions policy backtest [--policy FILE] [--since 30d]` answers "what would this
policy have done with what really happened?" before the policy is deployed:

- `history` reads what happened, from one of three sources: the bridge's own events table
  (each event's first view, its decision, approval and end), an exported Resource Graph
  `maintenanceresources` result (Azure's record: no decision, no first-seen time), or the
  relays' recorded envelopes (every IMDS document each VM saw, with its time);
- `replay` decides each event with the pure `functions.model.policy.decide` at the time
  the bridge first saw it, and derives from the decisions when each VM would have been
  taken away: the worst concurrent impact per scale set and availability set, and the holds
  that would have run to NotBefore;
- `render` prints it as a table or JSON; `cli` is the command.

Nothing here writes anywhere: the table source only reads.
"""
