"""The stages one document goes through, in order:

`ingest` (parse, order per VM; Event Grid notifications through `sources/`) →
`lifecycle` (per-event state across reporters) →
`transitions` (audit the decision, `capacity` guard, end events) → `approve` (claim, call an
approver) → `announce` (claim a transition, `publish` it to the topic). `watchdog` runs the
same stages on a timer for what no document triggers (silence, windows, retries);
`redecide` and `relay_recovery` are its special cases. `context.Pipeline` carries the
shared collaborators, passed whole.
"""
