"""`python -m functions ledger EVENT_ID [--csv]`: an event's impact ledger for a support case.

Reads the app's state tables with the app's own settings (StateStorage or
AzureWebJobsStorage, as `settings check` names them): export the app settings, then run it.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    ledger = sub.add_parser(
        "ledger",
        help="an event's impact ledger (advertised vs measured, per VM) as JSON or CSV",
        description="Per VM: NotBefore and DurationInSeconds as Azure advertised them, the "
        "approval, when its relay saw the event Started and when it left IMDS, the relay's "
        "longest polling gap and the guest wall-clock jump (functions/ledger.py).",
    )
    ledger.add_argument("event_id", help="the EventId (as on the event page)")
    ledger.add_argument("--csv", action="store_true", help="one CSV row per VM instead of JSON")


def run(args: argparse.Namespace) -> int:
    from azure.core.exceptions import AzureError

    from functions.ledger import as_csv, as_json, read_ledger
    from functions.settings import SettingsInvalid, load_settings
    from functions.store.rows import BadRow
    from functions.store.state import Store

    event_id = args.event_id.strip()
    if not event_id:
        print("ledger: EVENT_ID must not be empty", file=sys.stderr)
        return 2
    skipped: list = []
    try:
        store = Store.from_settings(load_settings())
        record, lines = read_ledger(store, event_id, skipped)
    except SettingsInvalid as exc:
        print(f"ledger: {exc}", file=sys.stderr)
        return 2
    except BadRow as exc:
        print(f"ledger: the event's row cannot be read: {exc}", file=sys.stderr)
        return 1
    except AzureError as exc:
        first = (str(exc).splitlines() or [""])[0][:300]
        print(f"ledger: the state tables could not be read: {first}", file=sys.stderr)
        return 1
    if record is None:
        print(f"ledger: no event {event_id[:128]!r} in the events table", file=sys.stderr)
        return 1
    for row in skipped:  # left out, each named: a line unreadable says so in the export too
        print(f"ledger: skipped a row that cannot be read: {row}", file=sys.stderr)
    sys.stdout.write(as_csv(lines) if args.csv else as_json(record, lines, skipped) + "\n")
    return 0
