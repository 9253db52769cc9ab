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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m functions")
    sub = parser.add_subparsers(dest="command", required=True)
    policy = sub.add_parser("policy", help="check or try the approval policy")
    what = policy.add_subparsers(dest="policy_command", required=True)
    what.add_parser("check", help="print the effective policy, or exit 2 with the error")
    explain = what.add_parser("explain", help="decide each event of a document or envelope")
    explain.add_argument("file", help="an IMDS document or a relay envelope (JSON); - for stdin")
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
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    for event in document.events if document else ():
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
