"""Heartbeats from the `heartbeats` queue, many per execution: VM liveness, nothing else.

A heartbeat says only "this relay is alive". Like every relay message it is believed only
for the VM its attested document names (functions.pipeline.admission): its own name and
callback address are claims, replaced by Azure's. On the session
queue each one held a session and cost an execution; here a batch of up to
`maxMessageBatchSize` (host.json) is one execution, and its liveness writes are merges of
plain columns grouped into one Table transaction per VM partition: no read, and never an
overwrite of what a document wrote (functions.store.vms.VmRows.heard). Silence and the
end of a silence are the watchdog's (one filtered query per VM partition finds them).

Contract with the caller (the batch trigger, the local host): returning completes every
message of the batch; raising abandons them all for redelivery (the writes are
idempotent). A message that is not a valid envelope, or proves no identity, is recorded as
rejected, never redelivered; a document that arrived here by mistake goes through ingest
as usual (the same admission included).
"""

from __future__ import annotations

import logging
from datetime import datetime

from pydantic import BaseModel

from functions.model.envelope import DocumentError, parse_envelope
from functions.pipeline.admission import FactsUnavailable, NotAdmitted
from functions.pipeline.context import Pipeline
from functions.pipeline.ingest import ingest_message

log = logging.getLogger(__name__)


class HeartbeatResult(BaseModel):
    heard: int = 0  # heartbeats recorded (several of one VM in a batch count once each)
    documents: int = 0  # documents that came on this queue, ingested
    rejected: int = 0
    unadmitted: int = 0  # from VMs Resource Graph could not describe yet (left out, logged)
    requests: int = 0  # Table transactions the liveness writes took
    bounded: int = 0  # over the per-VM bound (context.HeartbeatBound): not written


def ingest_heartbeats(
    bodies: list[bytes | str], pipeline: Pipeline, message_ids: list[str] | None = None
) -> HeartbeatResult:
    now = pipeline.clock.now()
    result = HeartbeatResult()
    beats: list[tuple[str, datetime, str | None, str | None]] = []
    for index, body in enumerate(bodies):
        message_id = (message_ids or [])[index] if message_ids else ""
        try:
            envelope = parse_envelope(body)
        except DocumentError as exc:
            log.warning("rejected heartbeat %s: %s", message_id or "?", exc)
            pipeline.store.reject(at=now, reason=str(exc), body=body, message_id=message_id)
            result.rejected += 1
            continue
        if envelope.kind != "heartbeat":
            ingest_message(body, pipeline, message_id)
            result.documents += 1
            continue
        admission = pipeline.admission
        try:
            if admission is None:
                raise NotAdmitted("no identity check configured: refused")
            ref = admission.admit(body, envelope, now, patient=False)
        except FactsUnavailable as exc:
            # A heartbeat says nothing lasting and the next one comes in minutes: one whose
            # VM Azure cannot describe yet is left out (logged, counted), rather than holding
            # back or redelivering the whole batch.
            log.warning("heartbeat %s not admitted yet: %s", message_id or "?", exc)
            result.unadmitted += 1
            continue
        except NotAdmitted as exc:
            log.warning("rejected heartbeat %s: %s", message_id or "?", exc)
            pipeline.store.reject(at=now, reason=str(exc), body=body, message_id=message_id)
            result.rejected += 1
            continue
        if not pipeline.heartbeat_bound.allow(ref.name, now):
            result.bounded += 1  # one write a minute is all a VM's liveness is worth
            continue
        beats.append((ref.name, now, ref.callback_url, envelope.relay_version or None))
    if result.bounded:
        log.info("heartbeats over the per-VM bound, not written: %d", result.bounded)
    if beats:
        result.requests = pipeline.store.heard(beats)
        result.heard = len(beats)
    return result
