"""Operator CLI: `python -m functions policy check` and `python -m functions policy explain FILE`.

Both read the same `POLICY__*` environment variables the function app reads, so a policy
can be tried before it is deployed (export the app settings, then run these).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from functions.model.envelope import DocumentError, parse_document, parse_envelope
from functions.model.policy import decide, effective_policy_json, load_policy
from functions.pipeline.sources.eventgrid import looks_like_event_grid, parse_message


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m functions")
    sub = parser.add_subparsers(dest="command", required=True)
    policy = sub.add_parser("policy", help="check or try the approval policy")
    what = policy.add_subparsers(dest="policy_command", required=True)
    what.add_parser("check", help="print the effective policy, or exit 2 with the error")
    explain = what.add_parser(
        "explain", help="decide each event of a document, an envelope or Event Grid events"
    )
    explain.add_argument(
        "file",
        help="an IMDS document, a relay envelope, or an Event Grid event or array of them "
        "(Event Grid schema or CloudEvents 1.0); JSON; - for stdin",
    )
    explain.add_argument("--now", help="ISO time to decide at (default: now), for windows")
    args = parser.parse_args(argv)

    load = load_policy()
    if load.policy is None:
        print(f"policy invalid: {load.error}", file=sys.stderr)
        return 2
    if args.policy_command == "check":
        print(effective_policy_json(load))
        return 0
    return _explain(load, args.file, args.now)


def _explain(load, file: str, now_text: str | None) -> int:
    try:
        raw = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        now = datetime.fromisoformat(now_text) if now_text else datetime.now(UTC)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        print(f"{file}: {exc}", file=sys.stderr)
        return 2
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        print(f"{file}: not JSON: {exc}", file=sys.stderr)
        return 2
    scale_sets: tuple[str, ...] = ()
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    if looks_like_event_grid(raw):
        return _explain_event_grid(load, file, data, now)
    try:
        if isinstance(data, dict) and "kind" in data and "vm" in data:
            envelope = parse_envelope(data)
            document = envelope.scheduled_events
            scale_sets = (envelope.vm.scale_set,) if envelope.vm.scale_set else ()
        else:
            document = parse_document(data)
    except DocumentError as exc:
        print(f"{file}: {exc}", file=sys.stderr)
        return 2
    for event in document.events if document else ():
        _print_decision(load, event, now, scale_sets)
    return 0


def _explain_event_grid(load, file: str, data: object, now: datetime) -> int:
    """Each notification decided as its IMDS event would be (a scale set owner counts as
    the event's scale set, as ingest records it)."""
    try:
        events, rejected = parse_message(data)  # type: ignore[arg-type]
    except DocumentError as exc:
        print(f"{file}: {exc}", file=sys.stderr)
        return 2
    for bad in rejected:
        print(f"{file}: {bad.reason}", file=sys.stderr)
    for grid in events:
        owner = grid.owner
        sets = (owner.name,) if owner.resource_type == "virtualMachineScaleSets" else ()
        _print_decision(load, grid.event, now, sets)
    return 2 if rejected else 0


def _print_decision(load, event, now: datetime, scale_sets: tuple[str, ...]) -> None:
    decision = decide(load, event, now, scale_sets)
    line = {
        "EventId": event.event_id,
        "EventType": event.event_type,
        "action": decision.action,
        "rule": decision.rule,
        "reason": decision.reason,
        "page": decision.page,
        "severity": decision.severity,
        "approve_after": decision.approve_after.isoformat() if decision.approve_after else None,
        "dry_run": decision.dry_run,
    }
    print(json.dumps(line))


if __name__ == "__main__":
    sys.exit(main())
