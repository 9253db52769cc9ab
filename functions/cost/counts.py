"""Per-operation counts the cost model multiplies: measured by `make bench`, not guessed.

`functions/cost/counts.json` holds the last measured numbers; `make bench` writes it anew
(`python -m tests.bench --counts-out FILE` elsewhere) and also prints the same object
under `"counts"` in its last JSON line, so `--counts` takes either file. The few numbers
no local run can measure (what Service Bus bills per message, the platform's own
telemetry rows) are marked in `assumed`, with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from functions.cost.prices import CostInputError, first_error

COUNTS_FILE = Path(__file__).with_name("counts.json")


class Counts(BaseModel):
    model_config = ConfigDict(extra="forbid")

    measured_at: AwareDatetime
    measured_by: str = Field(min_length=1)

    # One document through ingest, per document: 20 VMs of a set (64-character names)
    # report one event through Scheduled, Started and gone, 16 at a time. Every table the
    # app touches counts, the admission's read of the sender's identities row included.
    table_requests_per_document: float = Field(ge=0)
    table_entities_per_document: float = Field(ge=0)  # a batch counts each entity
    seconds_per_document: float = Field(gt=0)
    log_bytes_per_document: float = Field(ge=0)
    # Documents the relays of a set forward because of one event naming one VM.
    documents_per_event_named_vm: float = Field(ge=0)
    documents_per_event_per_setmate: float = Field(ge=0)
    notifications_per_event: float = Field(ge=0)  # messages published to the topic

    # Heartbeats, as the function app receives them; the per-heartbeat numbers were
    # measured at this many per execution. The monthly executions take their batch size
    # from host.json and the fleet's rate; the Functions ceiling (a fleet big enough to
    # fill batches) uses this batch with the time measured for it.
    heartbeats_per_execution: float = Field(ge=1)
    heartbeats_on_sessions: bool
    table_requests_per_heartbeat: float = Field(ge=0)
    table_entities_per_heartbeat: float = Field(ge=0)
    seconds_per_heartbeat_execution: float = Field(gt=0)
    log_bytes_per_heartbeat_execution: float = Field(ge=0)
    # Heartbeats as relays send them now (relay.liveness): straight into the liveness table, one
    # Insert Or Merge each, counted on the wire from real relay processes; no Service Bus
    # message, no execution. The numbers above are for relays that still send heartbeats
    # through Service Bus (installed before), which the model prices with --heartbeats
    # servicebus.
    table_requests_per_relay_heartbeat: float = Field(ge=0)
    table_entities_per_relay_heartbeat: float = Field(ge=0)
    # Share of heartbeat entity operations that land on the busiest partition.
    hot_partition_share: float = Field(gt=0, le=1)

    # One steady-state watchdog sweep: base + per_vm x VMs (fitted at two fleet sizes).
    watchdog_requests_per_sweep_base: float = Field(ge=0)
    watchdog_requests_per_sweep_per_vm: float = Field(ge=0)
    watchdog_seconds_per_sweep_base: float = Field(ge=0)
    watchdog_seconds_per_sweep_per_vm: float = Field(ge=0)

    # Stored bytes (entity bodies as written); per VM: its VM row and its identities row.
    table_bytes_per_vm: float = Field(ge=0)
    table_bytes_per_event: float = Field(ge=0)

    # Not measurable here; see `assumed`.
    topic_subscriptions: int = Field(ge=0)
    servicebus_operations_per_message: float = Field(ge=0)
    servicebus_credits_per_message: float = Field(ge=0)
    platform_log_bytes_per_execution: float = Field(ge=0)
    assumed: dict[str, str] = Field(default_factory=dict)


def load_counts(path: Path | str | None = None) -> Counts:
    """Read counts.json, or the bench's output (its last line's `counts`)."""
    file = Path(path) if path is not None else COUNTS_FILE
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CostInputError(f"{file}: {exc}") from None
    data = _json_object(text)
    if data is None:
        raise CostInputError(f"{file}: not JSON (nor a bench output ending in a JSON line)")
    if "counts" in data and isinstance(data["counts"], dict):
        data = data["counts"]  # the bench's last line
    try:
        return Counts.model_validate(data)
    except ValidationError as exc:
        raise CostInputError(f"{file}: not a counts file: {first_error(exc)}") from None


def _json_object(text: str) -> dict[str, Any] | None:
    """The whole text as a JSON object, else its last line that is one (a bench output)."""
    lines = [line for line in reversed(text.splitlines()) if line.startswith("{")]
    for candidate in (text, *lines):
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return data
    return None


def write_counts(counts: Counts, path: Path | str | None = None) -> Path:
    file = Path(path) if path is not None else COUNTS_FILE
    file.write_text(counts.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return file
