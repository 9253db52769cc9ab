"""`python -m simulator`: an IMDS Scheduled Events simulator on a local port.

Prints one line per VM with its base URL, then `READY {json}` for scripts, then one line per
document change, so a person can watch maintenance unfold and a script can find the URLs.
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from simulator.engine import DEFAULT_VM, Simulator, SimulatorError
from simulator.eventgrid import EventGridPublisher, directory_sink, http_sink
from simulator.identity import test_issuer
from simulator.scenarios import (
    SCENARIOS,
    EventSpec,
    ScenarioFileError,
    load_scenario_file,
    parse_iso_duration,
)
from simulator.server import SimulatorServer

OWNER_KINDS = ("virtualMachines", "virtualMachineScaleSets", "availabilitySets")


class _AddVm(argparse.Action):
    """Keep every VM-adding flag in one list, in command-line order (the first is the root)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        items = list(getattr(namespace, "vm_specs", None) or [])
        items.append((self.dest, values))
        namespace.vm_specs = items


def build_parser() -> argparse.ArgumentParser:
    scenario_list = "\n".join(f"  {name:<20} {s.summary}" for name, s in SCENARIOS.items())
    parser = argparse.ArgumentParser(
        prog="python -m simulator",
        description="Simulate Azure IMDS Scheduled Events for one or more VMs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"scenarios:\n{scenario_list}",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (default)")
    parser.add_argument("--vm", dest="vm", action=_AddVm, metavar="NAME", help="add a VM")
    parser.add_argument(
        "--availability-set",
        dest="availability_set",
        action=_AddVm,
        metavar="NAME:VM1,VM2",
        help="add VMs grouped in an availability set (they see each other's events)",
    )
    parser.add_argument(
        "--scale-set",
        dest="scale_set",
        action=_AddVm,
        metavar="NAME:COUNT[:PT10M]",
        help="add instances NAME_0..NAME_{COUNT-1} with terminate notifications",
    )
    parser.add_argument("--spot", dest="spot", action=_AddVm, metavar="NAME", help="add a Spot VM")
    parser.add_argument(
        "--zone",
        action="append",
        default=[],
        metavar="NAME:ZONE",
        help="place a VM or every VM of a set in an availability zone (repeatable)",
    )
    parser.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE",
        help="tag a VM or every VM of a set, as Resource Graph reports it (repeatable)",
    )
    parser.add_argument(
        "--terminate-timeout",
        default="PT5M",
        metavar="PT5M",
        help="scale sets' notBeforeTimeout, PT5M..PT15M (default PT5M)",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        metavar="NAME[@TARGET]",
        help="play a built-in scenario at start; TARGET: VM or set names, comma-separated "
        "(repeatable)",
    )
    parser.add_argument(
        "--scenario-file",
        action="append",
        default=[],
        metavar="FILE",
        help="play the events of a JSON scenario file (repeatable)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="N",
        help="divide every delay by N (60: 15 minutes last 15 seconds)",
    )
    parser.add_argument(
        "--type-scale",
        action="append",
        default=[],
        metavar="TYPE=N",
        help="a time scale of its own for one event type (repeatable), e.g. Preempt=6 so a "
        "Spot eviction's 30 s notice lasts 5 s while the rest plays at --time-scale",
    )
    parser.add_argument(
        "--approval-mode",
        choices=("any", "all"),
        default="any",
        help="start an event on one approval from its Resources (any, default) "
        "or only when every VM in Resources approved (all)",
    )
    parser.add_argument(
        "--rate-limit",
        type=float,
        default=None,
        metavar="N",
        help="answer 429 beyond N requests per second per VM (Azure: 5); default no limit",
    )
    parser.add_argument("--location", default="westeurope", help="the VMs' Azure region")
    grid = parser.add_argument_group(
        "agentless mode",
        "Event Grid notifications and Resource Manager's acknowledge API (served under "
        "{url}/arm: set the function app's ARM_ENDPOINT to it)",
    )
    grid.add_argument(
        "--event-grid",
        metavar="DIR|URL",
        help="publish every event change of the opted-in VMs and sets to a directory (one "
        "file per message: the local host's inbox) or POST it to an http(s) URL",
    )
    grid.add_argument(
        "--opt-in",
        action="append",
        default=[],
        metavar="NAME",
        help="a VM, scale set or availability set that opted in (repeatable; default: all)",
    )
    grid.add_argument(
        "--event-grid-schema",
        choices=("eventgrid", "cloudevents"),
        default="eventgrid",
        help="Event Grid schema (default) or CloudEvents 1.0",
    )
    grid.add_argument(
        "--event-grid-duplicates",
        type=float,
        default=0.0,
        metavar="RATE",
        help="share of notifications delivered twice (same id), 0..1",
    )
    grid.add_argument(
        "--event-grid-reorder",
        type=float,
        default=0.0,
        metavar="RATE",
        help="share of notifications held back until after the next one, 0..1",
    )
    grid.add_argument(
        "--event-grid-seed", type=int, default=None, metavar="N", help="seed for those choices"
    )
    parser.add_argument(
        "--play-freezes",
        metavar="CLOCK_DIR",
        help="a Started Freeze pauses its VMs' guests for its DurationInSeconds (their IMDS "
        "answers nothing meanwhile) and writes each pause to CLOCK_DIR/VM.json for a relay run "
        "under simulator/guest_clock.py (simulator/guest.py)",
    )
    parser.add_argument("--log-requests", action="store_true", help="log every HTTP request")
    parser.add_argument(
        "--write-ca-pem",
        metavar="FILE",
        help="write the CA that signs this simulator's attested documents (its roots, the "
        "cross-sign and the intermediate) to FILE, for ATTESTATION_CA_PEM or `attestation "
        "check --ca-pem` (set SIMULATOR_CA_DIR to keep the same CA across runs)",
    )
    parser.add_argument(
        "--exit-when-done",
        action="store_true",
        help="exit once every scenario has played out and no event is left",
    )
    parser.add_argument(
        "--list-scenarios", action="store_true", help="list the built-in scenarios and exit"
    )
    return parser


def _type_scales(values: list[str]) -> dict[str, float]:
    """`--type-scale Preempt=6` values -> {"Preempt": 6.0} (SimulatorError when malformed)."""
    from functions.model.envelope import KNOWN_EVENT_TYPES

    known = {t.casefold(): t for t in KNOWN_EVENT_TYPES}
    scales = {}
    for value in values:
        name, _, number = value.partition("=")
        if name.strip().casefold() not in known:
            types = ", ".join(sorted(known.values()))
            raise SimulatorError(f"--type-scale {value!r}: the type must be one of {types}")
        try:
            scale = float(number)
        except ValueError:
            scale = 0.0
        if not scale > 0:
            raise SimulatorError(f"--type-scale {value!r}: N must be a number greater than 0")
        scales[known[name.strip().casefold()]] = scale
    return scales


def build_simulator(args: argparse.Namespace) -> Simulator:
    """Turn the flags into a Simulator with its VMs (raises SimulatorError on bad values)."""
    if not args.time_scale > 0:
        raise SimulatorError("--time-scale must be greater than 0")
    try:
        timeout = parse_iso_duration(args.terminate_timeout)
    except ValueError as exc:
        raise SimulatorError(f"--terminate-timeout: {exc}") from None
    sim = Simulator(
        time_scale=args.time_scale,
        approval_mode=args.approval_mode,
        location=args.location,
        rate_limit=args.rate_limit,
        type_scales=_type_scales(getattr(args, "type_scale", [])),
    )
    if getattr(args, "play_freezes", None):
        sim.play_freezes(clock_dir=args.play_freezes)
    specs = getattr(args, "vm_specs", None) or [("vm", DEFAULT_VM)]
    for kind, value in specs:
        if kind == "vm":
            sim.add_vm(value)
        elif kind == "spot":
            sim.add_vm(value, spot=True)
        elif kind == "availability_set":
            name, sep, members = value.partition(":")
            vms = [m.strip() for m in members.split(",") if m.strip()]
            if not sep or not name or not vms:
                raise SimulatorError(f"--availability-set {value!r}: use NAME:VM1,VM2")
            sim.add_availability_set(name, vms)
        else:
            name, _, rest = value.partition(":")
            count_text, _, own_timeout = rest.partition(":")
            try:
                count = int(count_text)
                set_timeout = parse_iso_duration(own_timeout) if own_timeout else timeout
            except ValueError:
                raise SimulatorError(
                    f"--scale-set {value!r}: use NAME:COUNT or NAME:COUNT:PT10M"
                ) from None
            sim.add_scale_set(name, count, terminate_timeout=set_timeout)
    for value in getattr(args, "zone", []):
        target, sep, zone = value.rpartition(":")
        if not sep or not target or not zone:
            raise SimulatorError(f"--zone {value!r}: use NAME:ZONE")
        sim.place(target, zone=zone)
    for value in getattr(args, "tag", []):
        target, sep, pair = value.partition(":")
        key, eq, tag_value = pair.partition("=")
        if not sep or not target or not eq or not key:
            raise SimulatorError(f"--tag {value!r}: use NAME:KEY=VALUE")
        sim.place(target, tags={key: tag_value})
    return sim


def build_publisher(sim: Simulator, args: argparse.Namespace) -> EventGridPublisher | None:
    """The Event Grid stand-in the flags ask for (not started), or None."""
    if not args.event_grid:
        return None
    for name in args.opt_in:
        if not any(sim.owns(kind, name) for kind in OWNER_KINDS):
            raise ValueError(
                f"--opt-in {name!r}: no VM, scale set or availability set by that name"
            )
    target = args.event_grid
    sink = (
        http_sink(target) if target.startswith(("http://", "https://")) else directory_sink(target)
    )
    return EventGridPublisher(
        sim,
        sink,
        opted_in=args.opt_in or ["*"],
        schema=args.event_grid_schema,
        duplicate_rate=args.event_grid_duplicates,
        reorder_rate=args.event_grid_reorder,
        seed=args.event_grid_seed,
    )


def schedule_scenarios(sim: Simulator, args: argparse.Namespace) -> None:
    """Check every --scenario and --scenario-file entry, then schedule them (offsets from now)."""
    specs: list[EventSpec] = []
    for item in args.scenario:
        name, _, target = item.partition("@")
        try:
            specs.append(EventSpec(scenario=name, target=target or None))
        except ValueError as exc:
            raise SimulatorError(f"--scenario {item!r}: {_first_line(exc)}") from None
    for path in args.scenario_file:
        specs.extend(load_scenario_file(path))
    for spec in specs:
        sim.schedule(spec)


def _first_line(exc: Exception) -> str:
    text = str(exc)
    if "Value error, " in text:
        text = text.split("Value error, ", 1)[1]
    return text.splitlines()[0]


def summarize(document: dict[str, Any]) -> str:
    events = document.get("Events") or []
    if not events:
        return "no events"
    parts = []
    for event in events:
        line = (
            f"{event['EventType']} {event['EventStatus']} {event['EventId']} "
            f"Resources={','.join(event['Resources'])}"
        )
        if event.get("NotBefore"):
            line += f" NotBefore={event['NotBefore']!r}"
        parts.append(line)
    return "; ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_scenarios:
        for name, scenario in SCENARIOS.items():
            print(f"{name:<20} {scenario.summary}")
        return 0
    try:
        sim = build_simulator(args)
    except SimulatorError as exc:
        parser.error(str(exc))
    if args.write_ca_pem:
        try:
            Path(args.write_ca_pem).write_text(test_issuer().root_pem, encoding="utf-8")
        except OSError as exc:
            parser.error(f"--write-ca-pem {args.write_ca_pem}: {exc.strerror or exc}")
        print(f"CA written to {args.write_ca_pem}", flush=True)

    changes: queue.Queue[str] = queue.Queue()
    try:
        publisher = build_publisher(sim, args)
    except ValueError as exc:
        parser.error(str(exc))

    def on_change(vm: str, incarnation: int, document: dict[str, Any]) -> None:
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        changes.put(f"{stamp} {vm} incarnation {incarnation}: {summarize(document)}")

    sim.subscribe(on_change)
    try:
        server = SimulatorServer(
            sim, host=args.host, port=args.port, log_requests=args.log_requests
        ).start()
    except OSError as exc:
        parser.error(f"cannot listen on {args.host}:{args.port}: {exc.strerror}")
    if publisher is not None:
        publisher.start()  # before the scenarios: their first notifications count too
    try:
        try:
            schedule_scenarios(sim, args)
        except (SimulatorError, ScenarioFileError) as exc:
            parser.error(str(exc))
        root = sim.root_vm()
        urls = server.vm_urls()
        for name, url in urls.items():
            suffix = f" (also at {server.url})" if name == root else ""
            print(f"VM {name}: {url}{suffix}", flush=True)
        ready = {"url": server.url, "root": root, "vms": urls, "arm": server.arm_url}
        # SIGTERM is ours before READY says so: a caller may stop us the moment it reads it.
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        try:
            print(f"READY {json.dumps(ready)}", flush=True)
            return _run(sim, changes, args.exit_when_done, stop)
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        if publisher is not None:
            publisher.stop()
        server.stop()


def _run(
    sim: Simulator, changes: queue.Queue[str], exit_when_done: bool, stop: threading.Event
) -> int:
    """Print the documents' changes until SIGTERM (`stop`), Ctrl-C or, with
    --exit-when-done, the last scenario played."""
    try:
        while not stop.is_set():
            _drain(changes)
            if exit_when_done and sim.idle:
                time.sleep(0.1)  # let the last change reach the queue
                _drain(changes)
                print("all scenarios played out", flush=True)
                break
            stop.wait(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        _drain(changes)
    print("simulator stopped", flush=True)
    return 0


def _drain(changes: queue.Queue[str]) -> None:
    while True:
        try:
            print(changes.get_nowait(), flush=True)
        except queue.Empty:
            return


if __name__ == "__main__":
    sys.exit(main())
