"""`make demo`: real maintenance played on one machine, end to end, in about a minute.

The IMDS simulator plays a small fleet's maintenance at 60x speed; one real relay per VM
forwards every changed document into a shared inbox directory (the local stand-in for the
Service Bus queue); the functions' local host runs the same ingest, policy, approval and
fan-out code as Azure, with state in Azurite; local receivers stand in for Teams, Slack,
PagerDuty and a webhook unless real URLs are set in the environment. The timeline printed
as it goes is built from what each part actually observed (documents, decisions, HTTP requests that
arrived, StartRequests the simulator received), never from what we expected, so a broken
part shows up as a failed outcome and a non-zero exit, which is how CI uses it.

The orchestration (`Demo`) is a library too: the end-to-end tests and the bench drive it.
This module is the entry point and the names they import; the parts live beside it:
plan (fleet and steps), options, stack (processes), watcher (IMDS ground truth),
subscription and channels (fan-out), orchestration (`Demo`), outcomes (the checks), cli.
"""

from __future__ import annotations

import sys

from local.channels import LOCAL_ROUTING_KEY, Delivery, webhook_verifier
from local.cli import main, run
from local.options import DEFAULT_REPORT, ROOT, DemoAborted, DemoOptions
from local.orchestration import Demo
from local.plan import FLEET, PLAN, Step, VmSpec, check_plan
from local.stack import Stack, stop_process
from local.subscription import Subscription
from local.watcher import EventTrack, FleetWatcher, describe_new

__all__ = [
    "DEFAULT_REPORT",
    "FLEET",
    "LOCAL_ROUTING_KEY",
    "PLAN",
    "ROOT",
    "Delivery",
    "Demo",
    "DemoAborted",
    "DemoOptions",
    "EventTrack",
    "FleetWatcher",
    "Stack",
    "Step",
    "Subscription",
    "VmSpec",
    "check_plan",
    "describe_new",
    "main",
    "run",
    "stop_process",
    "webhook_verifier",
]

if __name__ == "__main__":
    sys.exit(main())
