"""Table storage: the fleet's state between messages.

`records` are the rows (VMs, events, capacity slots); `state.Store` reads and writes them
with ETags so concurrent invocations agree and lays them out so no partition holds the
fleet, one module per table (`vms`, `events`, `audit`) over the shared `rows` machinery;
`keys` turns names into keys one-to-one, `claims` is the one "claim, act, mark done, redo
if stale" encoding for everything done once fleet-wide, `drains`
keeps the terminate workflow's step rows, `deliveries` what each channel posted (or
refused for good) per announcement. Nothing above this package talks to Azure
Tables directly.
"""
