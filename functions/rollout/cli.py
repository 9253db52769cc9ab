"""`python -m functions relay rollout | rollback | remove | versions` (docs/rollout.md).

Lists the Linux VMs under `--scope` from Resource Graph, shows which relay version each
set runs (the verified liveness rows), then runs managed Run Command on them in batches
(functions.rollout.plan, .run). ARM and Resource Graph with azure-identity's
DefaultAzureCredential (`az login` works); the app's tables with the app's settings, as
`python -m functions ledger` reads them (export the app settings first).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROLOGUE = ROOT / "infra" / "relay" / "rollout-prologue.sh"
ADD_RELAY = ROOT / "infra" / "relay" / "add-relay.sh"
REMOVE = ROOT / "infra" / "relay" / "remove-relay.sh"
BUNDLE = ROOT / "dist" / "add-relay-bundled.sh"


def add_parser(sub: argparse._SubParsersAction) -> None:
    relay = sub.add_parser(
        "relay",
        help="roll the relay out, upgrade, roll back or remove it, in batches (docs/rollout.md)",
    )
    what = relay.add_subparsers(dest="relay_command", required=True)
    for name, text in (
        ("versions", "list the VMs in scope and the relay version each runs; changes nothing"),
        ("rollout", "install or upgrade the relay, batch by batch, each awaiting heartbeats"),
        ("rollback", "roll the VMs of the last rollout back to the version they ran before"),
        ("remove", "take the relay off (units, socket, state) and forget the VMs' rows"),
    ):
        command = what.add_parser(name, help=text, description=text)
        command.add_argument(
            "--scope",
            required=True,
            help="an ARM id: /subscriptions/ID[/resourceGroups/RG[/providers/Microsoft.Compute/"
            "virtualMachineScaleSets/NAME (Uniform or Flexible) | /virtualMachines/NAME]]",
        )
        if name == "versions":
            continue
        if name in ("rollout", "rollback"):
            command.add_argument(
                "--version", help="the relay_version the new relay reports (rollout: required)"
            )
            command.add_argument(
                "--package",
                help="https://HOST/scheduled-events-relay.pyz#sha256=HEX (a release asset), or "
                "`embedded`: the relay of dist/add-relay-bundled.sh (`make relay`)",
            )
        if name == "rollout":
            command.add_argument(
                "--install-args",
                default="",
                help="for VMs with no relay yet: the deployment's relayBootstrapArguments",
            )
        command.add_argument("--percent", type=float, default=10.0, help="of a set per batch")
        command.add_argument("--canary", type=int, default=1, help="VMs in the first batch")
        command.add_argument("--max-batch", type=int, help="VMs per batch at most, all sets")
        command.add_argument(
            "--wait", type=float, default=420.0, help="seconds a batch waits for heartbeats"
        )
        command.add_argument("--dry-run", action="store_true", help="plan and print only")
        command.add_argument("--history", default="relay-rollout-history.json")


def run(args: argparse.Namespace, world: Any = None) -> int:
    """Exit 0: every VM came back; 1: a batch stopped the run (the VMs named); 2: bad
    arguments or settings. `world` gives the clients (tests); by default Azure's."""
    from functions.identity.resource_graph import FactsUnavailable
    from functions.rollout.arm import ArmError
    from functions.rollout.targets import ScopeError, list_targets, parse_scope

    try:
        scope, subscription = parse_scope(args.scope)
        world = world or _azure(subscription)
        targets = list_targets(world.graph, scope)
    except (ScopeError, ValueError) as exc:
        print(f"relay {args.relay_command}: {exc}", file=sys.stderr)
        return 2
    except (FactsUnavailable, ArmError) as exc:
        print(f"relay {args.relay_command}: cannot list the VMs: {exc}", file=sys.stderr)
        return 1
    heard = {t.vm_id: world.state.latest(t) for t in targets}
    _print_versions(targets, heard)
    if args.relay_command == "versions":
        return 0
    try:
        action, chosen = _action(args, scope, targets, heard)
    except (OSError, ValueError) as exc:
        print(f"relay {args.relay_command}: {exc}", file=sys.stderr)
        return 2
    return _run(args, world, scope, action, targets, chosen)


def _action(args: argparse.Namespace, scope: str, targets: list, heard: dict) -> tuple[Any, list]:
    """What to run, and on which of `targets`."""
    from functions.rollout import history
    from functions.rollout.run import Action

    if args.relay_command == "remove":
        return Action("remove", REMOVE.read_text(encoding="utf-8")), list(targets)
    package, version = args.package, args.version
    chosen = list(targets)
    if args.relay_command == "rollback":
        runs = history.read(Path(args.history))
        last, earlier = history.rollback_of(runs, scope, given=bool(package and version))
        package = package or (earlier or {}).get("package")
        version = version or (earlier or {}).get("version")
        ran = {*last.get("done", []), *last.get("failed", {})}
        chosen = [t for t in targets if t.vm_id in ran]
    if not version:
        raise ValueError("--version: the relay_version the new relay reports")
    if not package:
        raise ValueError(
            "--package: https://HOST/scheduled-events-relay.pyz#sha256=HEX or embedded"
        )
    head = PROLOGUE.read_text(encoding="utf-8")
    if package == "embedded":
        if not BUNDLE.exists():
            raise ValueError(f"{BUNDLE.relative_to(ROOT)} is missing: run `make relay` first")
        script = head + BUNDLE.read_text(encoding="utf-8")
    elif package.startswith("https://") and "#sha256=" in package:
        script = head + ADD_RELAY.read_text(encoding="utf-8")
    else:
        raise ValueError(f"--package {package[:200]!r}: https://...#sha256=HEX or embedded")
    install = getattr(args, "install_args", "")
    action = Action(args.relay_command, script, version, package, install)
    # A rollout skips VMs whose relay heartbeats the version already (so a stopped rollout
    # resumes by running it again); a rollback runs on each VM the last run touched, as a
    # VM that never came back may still heartbeat from before.
    already = [
        t
        for t in chosen
        if args.relay_command == "rollout" and (heard.get(t.vm_id) or ("",))[0] == version
    ]
    for target in already:
        print(f"already at {version}: {target.name}")
    return action, [t for t in chosen if t not in already]


def _run(args, world, scope: str, action, targets: list, chosen: list) -> int:
    from functions.rollout import history
    from functions.rollout.plan import describe_limits, plan_batches

    budgets = _budgets()
    if budgets is None:
        return 2
    try:
        batches = plan_batches(
            chosen, budgets, args.percent, args.canary, args.max_batch, sizes_from=targets
        )
    except ValueError as exc:
        print(f"relay {args.relay_command}: {exc}", file=sys.stderr)
        return 2
    target = f" {action.version} ({action.package.split('#')[0]})" if action.version else ""
    print(f"{action.verb}{target}: {len(chosen)} VM(s) in {len(batches)} batch(es)")
    print(describe_limits(targets, budgets, args.percent))
    if args.dry_run:
        for number, batch in enumerate(batches, 1):
            print(f"batch {number}: " + ", ".join(t.name for t in batch))
        return 0
    if not batches:
        print("nothing to do")
        return 0
    run_id = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
    runner = world.runner(wait=args.wait)
    outcome = runner.run(action, batches, run_id)
    history.append(
        Path(args.history),
        {
            "id": run_id,
            "verb": action.verb,
            "scope": scope,
            "version": action.version,
            "package": action.package,
            "done": outcome.done,
            "failed": outcome.failed,
            "previous": outcome.previous,
        },
    )
    if outcome.failed:
        print(
            f"{action.verb} stopped: {len(outcome.failed)} VM(s) did not come back, "
            f"{len(outcome.done)} did; roll back with `relay rollback --scope {args.scope}`"
            if action.verb == "rollout"
            else f"{action.verb} stopped: {len(outcome.failed)} VM(s) did not finish"
        )
        return 1
    print(f"{action.verb} done: {len(outcome.done)} VM(s)")
    return 0


def _print_versions(targets: list, heard: dict) -> None:
    """The fleet view: per set, how many VMs run which relay version."""
    sets: dict[str, Counter] = {}
    kinds: dict[str, str] = {}
    for target in targets:
        seen = heard.get(target.vm_id)
        sets.setdefault(target.set_label, Counter())[seen[0] if seen else "no relay heard"] += 1
        kinds[target.set_label] = target.kind
    print(f"{len(targets)} Linux VM(s) in scope")
    for label in sorted(sets, key=str.casefold):
        versions = ", ".join(f"{v}: {n}" for v, n in sorted(sets[label].items()))
        print(f"  {label} [{kinds[label]}]: {versions}")


def _budgets() -> tuple | None:
    from functions.model.budgets import effective_budgets
    from functions.model.policy import load_policy

    load = load_policy()
    if load.policy is None:
        print(f"policy invalid: {load.error}", file=sys.stderr)
        return None
    return effective_budgets(load.policy.budgets, load.policy.max_concurrent_per_set)


class _Azure:
    """Azure's clients: Resource Graph and ARM with DefaultAzureCredential, the app's
    tables with the app's settings."""

    def __init__(self, subscription: str) -> None:
        import requests
        from azure.identity import DefaultAzureCredential

        from functions.identity.resource_graph import ResourceGraph
        from functions.rollout.app import AppState
        from functions.rollout.arm import RunCommands
        from functions.settings import load_settings

        settings = load_settings()
        self.credential = DefaultAzureCredential()
        self.session = requests.Session()
        self.endpoint = settings.arm_endpoint
        self.graph = ResourceGraph(self.session, self.credential, self.endpoint, [subscription])
        self.arm = RunCommands(self.session, self.credential, self.endpoint)
        self.state = AppState.from_settings(settings)

    def runner(self, wait: float) -> Any:
        from functions.rollout.run import Runner

        return Runner(self.arm, self.state, self.state, heartbeat_wait=wait, say=_say)


def _say(line: str) -> None:
    print(line, flush=True)


def _azure(subscription: str) -> _Azure:
    from azure.core.exceptions import AzureError

    from functions.settings import SettingsInvalid

    try:
        return _Azure(subscription)
    except (SettingsInvalid, AzureError) as exc:
        raise ValueError(f"the app's settings or tables: {exc}") from None
