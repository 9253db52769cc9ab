"""One document writes its event row at most twice on the common paths (issue 31, item 6):
the decision with the intent of everything after it, then the outcome with every
announcement marked done. On 8f0b6c2 one message wrote the same event row up to 8 times."""

from __future__ import annotations

from tests.bench.row_writes import measure


def test_one_document_writes_its_event_row_at_most_three_times(azurite):
    """The writer's record (the decision on its view), the reconcile's claims (the
    announcements and the approval in one write), the outcome with every announcement
    marked done (issue 46: writers claim nothing; it was two when ingest claimed)."""
    numbers = measure(azurite)
    assert numbers["event_row_writes_per_doc"] <= 3, numbers
