"""The Azure Functions handlers, thin on purpose: each parses its trigger and calls plain
functions. `core`: ingest (documents queue), watchdog (timer), status and approve (HTTP);
`notify`: one topic subscription per channel; `terminate`: the drain workflow."""
