"""Phase `row_writes` (tests/bench/row_writes.py, issue 31): the most times one document
writes one event row over the common paths (at most two)."""

from __future__ import annotations

from typing import Any

from tests.bench.runner import Bench, Phase


def _row_writes_phase(bench: Bench) -> dict[str, Any]:
    from tests.bench.row_writes import measure

    numbers = measure(bench.azurite("state"))
    numbers.pop("event_row_writes_per_doc_each")
    return numbers


PHASE = Phase(
    "row_writes",
    lambda a: "event row writes per document: approve, Started, end, a shared Freeze",
    _row_writes_phase,
    azurite="state",
    # Three since issue 46: the writer records, and only the reconcile by key claims (the
    # decision's row, then the claims with the approval, then the outcome).
    targets={"event_row_writes_per_doc": ("<=", 3)},
)
