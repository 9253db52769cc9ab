"""Operator CLI: `python -m functions policy check`, `python -m functions policy explain FILE`,
`python -m functions policy backtest [--policy FILE] [--since 30d]` (functions/backtest),
`python -m functions settings check [--strict]`, `python -m functions cost --vms N`,
`python -m functions attestation check FILE` (functions/identity/check_cli.py),
`python -m functions ledger EVENT_ID [--csv]` (functions/ledger_cli.py) and
`python -m functions relay versions|rollout|rollback|remove --scope ID` (functions/rollout).

The policy commands read the same `POLICY__*` environment variables the function app
reads, so a policy can be tried before it is deployed (export the app settings, then run
these). `cost` prints a deployment's monthly cost and capacity (functions/cost).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from functions.model.drains import DrainKind
from functions.model.envelope import (
    DocumentError,
    looks_like_event_grid,
    parse_document,
    parse_envelope,
)
from functions.model.policy import (
    NO_DRAIN_KIND,
    NO_DRAIN_TEXT,
    decide,
    effective_policy_json,
    load_policy,
)
from functions.pipeline.sources.eventgrid import parse_message


def main(argv: list[str] | None = None) -> int:
    """Every command; what it prints carries no terminal control (functions.terminal): a
    VM's words (an EventType, an EventId) reach the operator's terminal."""
    from functions.terminal import printable_output

    with printable_output():
        return _main(argv)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m functions")
    sub = parser.add_subparsers(dest="command", required=True)
    policy = sub.add_parser("policy", help="check or try the approval policy")
    what = policy.add_subparsers(dest="policy_command", required=True)
    policy_check = what.add_parser(
        "check",
        help="print the effective policy, or exit 2 with the error; says where it came from",
    )
    policy_check.add_argument(
        "--file",
        help="the policy of app settings (local.settings.json, `az functionapp config "
        "appsettings list` output) or of a parameter file (infra/main.bicepparam)",
    )
    explain = what.add_parser(
        "explain", help="decide each event of a document, an envelope or Event Grid events"
    )
    explain.add_argument(
        "file",
        help="an IMDS document, a relay envelope, or an Event Grid event or array of them "
        "(Event Grid schema or CloudEvents 1.0); JSON; - for stdin",
    )
    explain.add_argument(
        "--file",
        dest="settings_file",
        metavar="FILE",
        help="the policy (and DRAIN__* settings) of a parameter file (infra/main.bicepparam) "
        "or of app settings, instead of this shell's",
    )
    explain.add_argument("--now", help="ISO time to decide at (default: now), for windows")
    explain.add_argument(
        "--drain",
        choices=("hook", "http", "readiness", "none"),
        help="the drain the VM really has (default: what the DRAIN__* settings give every "
        "VM); none: no working drain, so Platform events are held to NotBefore and User "
        "events approved at once",
    )
    explain.add_argument(
        "--scale-set",
        action="append",
        default=[],
        metavar="NAME",
        help="the scale set of the document's VM (repeatable), for `scale_sets` rules: a plain "
        "IMDS document does not name it (an envelope or an Event Grid event does)",
    )
    from functions import budget_explain
    from functions.backtest import cli as backtest_cli

    budget_explain.add_arguments(explain)
    backtest_cli.add_parser(what)
    _cost_parser(sub)
    _settings_parser(sub)
    from functions.identity import check_cli

    check_cli.add_parser(sub)
    from functions import ledger_cli

    ledger_cli.add_parser(sub)
    from functions.rollout import cli as relay_cli

    relay_cli.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "relay":
        return relay_cli.run(args)
    if args.command == "attestation":
        return check_cli.run(args)
    if args.command == "ledger":
        return ledger_cli.run(args)
    if args.command == "cost":
        return _cost(args)
    if args.command == "settings":
        from functions.settings_cli import run_settings_check

        return run_settings_check(args)
    if args.policy_command == "backtest":
        return backtest_cli.run(args)

    if args.policy_command in ("check", "explain"):
        source = args.file if args.policy_command == "check" else args.settings_file
        if args.policy_command == "check" or source:
            code = _policy_source(source)
            if code:
                return code
    load = load_policy()
    if load.policy is None:
        print(f"policy invalid: {load.error}", file=sys.stderr)
        return 2
    if args.policy_command == "check":
        print(effective_policy_json(load))
        for warning in load.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        _warn_not_enforcing()
        return 0
    return _explain(load, args.file, args.now, tuple(args.scale_set), args)


def _policy_source(file: str | None) -> int:
    """Print where the policy comes from (a file read first, with --file); 2 if unreadable."""
    from functions.settings_cli import LoadedFile, SettingsFileError, load_file, policy_source

    loaded = None
    if file:
        try:
            loaded = load_file(file)
        except SettingsFileError as exc:
            print(f"policy: {exc}", file=sys.stderr)
            return 2
        for setting, why in loaded.errors:
            print(f"note: {setting}: {why}", file=sys.stderr)
    print(policy_source(loaded or LoadedFile(label="environment")), file=sys.stderr)
    return 0


def _warn_not_enforcing() -> None:
    """The policy decides only for VMs the bridge trusts: say so when it trusts on claims."""
    from pydantic import ValidationError

    from functions.setting_names import error_message
    from functions.settings import Settings

    try:
        mode = Settings().attestation_mode
    except ValidationError as exc:
        # The policy is fine; another setting is not (a short APP_SECRET): one line each,
        # never the traceback (issue 45). `settings check` says everything.
        for error in exc.errors(include_url=False):
            name = str(error["loc"][0]).upper() if error["loc"] else "settings"
            ctx = error.get("ctx") or {}
            what = (
                f"{ctx['actual_length']} characters; at least {ctx['min_length']} needed"
                if error["type"] == "too_short" and "min_length" in ctx
                else error_message(error)
            )
            print(
                f"warning: {name}: {what}: the app would not start with this "
                "environment (`settings check` lists every setting)",
                file=sys.stderr,
            )
        return
    if mode != "enforce":
        print(
            f"warning: ATTESTATION_MODE={mode}: the bridge is NOT ENFORCING attestation; a "
            "message whose attested document fails is admitted if it carries its VM's "
            "callback key from an earlier attested message (set ATTESTATION_MODE=enforce "
            "once the fleet page counts none)",
            file=sys.stderr,
        )


def _explain(
    load,
    file: str,
    now_text: str | None,
    given_sets: tuple[str, ...] = (),
    args: argparse.Namespace | None = None,
) -> int:
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
    scale_sets: tuple[str, ...] = tuple(n for n in given_sets if n)
    known = bool(given_sets)  # an envelope names the VM's set too (or that it has none)
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    try:
        budgets = _BudgetFacts(load, args, scale_sets)
    except ValueError as exc:
        print(f"policy explain: {exc}", file=sys.stderr)
        return 2
    if looks_like_event_grid(raw):
        return _explain_event_grid(load, file, data, now, budgets)
    vm = getattr(args, "vm", None)
    try:
        if isinstance(data, dict) and "kind" in data and "vm" in data:
            envelope = parse_envelope(data)
            document = envelope.scheduled_events
            if envelope.vm.scale_set and not given_sets:
                scale_sets = (envelope.vm.scale_set,)
                budgets = _BudgetFacts(load, args, scale_sets)
            vm = vm or envelope.vm.name
            known = True
        else:
            document = parse_document(data)
    except DocumentError as exc:
        print(f"{file}: {exc}", file=sys.stderr)
        return 2
    events = document.events if document else ()
    if not events:
        incarnation = document.document_incarnation if document else None
        print(
            f"{file}: no events (DocumentIncarnation {incarnation}): nothing to decide; "
            "IMDS lists an event only while it is scheduled or started",
            file=sys.stderr,
        )
    for event in events:
        vms = (vm,) if vm else tuple(event.resources)
        lines = budgets.lines(event, vms)
        _print_decision(
            load,
            event,
            now,
            scale_sets,
            scale_set_known=known,
            budgets=lines,
            args=args,
            facts=budgets.facts,
        )
    return 0


class _BudgetFacts:
    """The budget keys of an explain line (functions.budget_explain), only where budgets
    are set or the VM's facts were given: a policy without budgets prints as before."""

    def __init__(self, load, args: argparse.Namespace | None, scale_sets: tuple[str, ...]) -> None:
        from functions import budget_explain

        self.policy = load.policy
        self.args = args
        self.facts = budget_explain.Facts(args or argparse.Namespace(), scale_sets)
        wanted = self.policy is not None and (self.policy.budgets or self.facts.flags)
        self.wanted = bool(wanted)

    def lines(self, event, vms: tuple[str, ...]) -> dict:
        from functions import budget_explain

        if not self.wanted or not vms:
            return {}
        return budget_explain.budget_lines(self.policy, event, vms, self.facts)


def _settings_parser(sub: argparse._SubParsersAction) -> None:
    settings = sub.add_parser("settings", help="check every app setting the app reads")
    what = settings.add_subparsers(dest="settings_command", required=True)
    check = what.add_parser(
        "check",
        help="validate the settings as the app does at start; exit 2 on errors",
        description="Reads the environment (and --file) with the app's own models. Errors "
        "are what the app refuses (it fails closed on them); warnings are what it logs.",
    )
    check.add_argument("--strict", action="store_true", help="warnings are errors too")
    check.add_argument(
        "--file",
        help="app settings to check instead of (on top of) the environment: local.settings.json "
        "or the output of `az functionapp config appsettings list`",
    )
    check.add_argument(
        "--deployed",
        metavar="FILE",
        help="with --file main.bicepparam: what runs now, to say what a redeploy from the file "
        "would change: `az deployment group show -g RG -n NAME --query properties.parameters` "
        "or `az functionapp config appsettings list` output",
    )
    check.add_argument(
        "--local",
        action="store_true",
        help="leave out the Azure connections (Service Bus, storage, APP_SECRET), as the "
        "local host supplies its own",
    )


def _cost_parser(sub: argparse._SubParsersAction) -> None:
    cost = sub.add_parser(
        "cost",
        help="monthly cost by part and the capacity ceiling of one deployment",
        description="From the counts `make bench` measured (functions/cost/counts.json) and "
        "the dated list prices (functions/cost/prices.json).",
    )
    cost.add_argument("--vms", type=int, required=True, help="VMs in the fleet")
    cost.add_argument("--set-size", type=int, default=20, help="VMs per availability set")
    cost.add_argument("--events-per-vm-month", type=float, default=1.0, help="default 1")
    cost.add_argument("--heartbeat-seconds", type=float, default=300.0, help="default 300")
    cost.add_argument("--retention-days", type=float, default=30.0, help="ended events kept")
    cost.add_argument(
        "--heartbeats",
        choices=("table", "servicebus"),
        default="table",
        help="how relays send heartbeats: straight into the VM table (default; relays "
        "installed by this release) or through Service Bus (relays installed before)",
    )
    cost.add_argument(
        "--network",
        choices=("new", "existing"),
        help="new: the template's VNet with its NAT gateway (the Bicep default); "
        "existing: your VNet and egress (createVirtualNetwork=false)",
    )
    cost.add_argument(
        "--relays-behind-nat",
        type=float,
        default=1.0,
        help="share of the relays whose VMs send through the template's NAT gateway (default 1)",
    )
    cost.add_argument("--instance-memory-mb", type=int, help="default: the Bicep default")
    cost.add_argument("--max-instances", type=int, help="default: the Bicep default")
    cost.add_argument("--prices", help="a price table like functions/cost/prices.json")
    cost.add_argument("--counts", help="counts.json, or a `make bench` output")
    cost.add_argument("--free-grants", action="store_true", help="subtract Flex free grants")
    cost.add_argument("--json", action="store_true", help="the estimate as one JSON object")


def _cost(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from functions.cost.counts import load_counts
    from functions.cost.model import Workload, estimate, load_deployment
    from functions.cost.prices import CostInputError, load_prices
    from functions.cost.report import render

    try:
        workload = Workload(
            vms=args.vms,
            set_size=args.set_size,
            events_per_vm_month=args.events_per_vm_month,
            heartbeat_seconds=args.heartbeat_seconds,
            retention_days=args.retention_days,
            heartbeats=args.heartbeats,
            relays_behind_nat=args.relays_behind_nat,
        )
        deployment = load_deployment(
            instance_memory_mb=args.instance_memory_mb,
            max_instances=args.max_instances,
            network=args.network,
        )
        result = estimate(
            workload,
            deployment,
            load_counts(args.counts),
            load_prices(args.prices),
            free_grants=args.free_grants,
        )
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        option = "--" + str(error["loc"][0]).replace("_", "-") if error["loc"] else "input"
        print(f"cost: {option}: {error['msg']}", file=sys.stderr)
        return 2
    except CostInputError as exc:
        print(f"cost: {exc}", file=sys.stderr)
        return 2
    print(result.model_dump_json() if args.json else render(result))
    return 0


def _explain_event_grid(load, file: str, data: object, now: datetime, budgets=None) -> int:
    """Each notification decided as its IMDS event would be (a scale set owner counts as
    the event's scale set, as ingest records it)."""
    try:
        events, rejected = parse_message(data)  # type: ignore[arg-type]
    except DocumentError as exc:
        print(f"{file}: {exc}", file=sys.stderr)
        return 2
    for bad in rejected:
        print(f"{file}: {bad.reason}", file=sys.stderr)
    if not events and not rejected:
        print(f"{file}: no Scheduled Events notification: nothing to decide", file=sys.stderr)
    for grid in events:
        owner = grid.owner
        sets = (owner.name,) if owner.resource_type == "virtualMachineScaleSets" else ()
        lines = budgets.lines(grid.event, tuple(grid.event.resources)) if budgets else {}
        _print_decision(
            load,
            grid.event,
            now,
            sets,
            scale_set_known=True,
            budgets=lines,
            args=getattr(budgets, "args", None),
            facts=getattr(budgets, "facts", None),
        )
    return 2 if rejected else 0


def _print_decision(
    load,
    event,
    now: datetime,
    scale_sets: tuple[str, ...],
    scale_set_known: bool = False,
    budgets: dict | None = None,
    args: argparse.Namespace | None = None,
    facts=None,
) -> None:
    """One JSON line: the decision, what a `drain` will really do with the DRAIN__*
    settings in this environment, and the rules that could not be evaluated (a
    `scale_sets` rule against a document that does not say the VM's set)."""
    drain, drain_why = _vm_drain(args)
    tags = facts.tags if facts is not None and facts.tags else None
    decision = decide(load, event, now, scale_sets, tags=tags, drain=drain)
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
    if decision.action == "drain":
        line["drain"] = _drain_plan()
    unknown = _unevaluated(load, decision.rule, scale_sets, scale_set_known)
    if tags is None:
        unknown += _untagged(load, decision.rule)
    if unknown:
        line["not_evaluated"] = unknown
        print(
            f"warning: {event.event_id}: {'; '.join(unknown)}: the document does not say the "
            "VM's scale set or tags; pass --scale-set NAME (a VM in no scale set: --scale-set "
            "''), --tag NAME=VALUE",
            file=sys.stderr,
        )
    if drain == NO_DRAIN_KIND and NO_DRAIN_TEXT in decision.reason:
        line["drain"] = f"{NO_DRAIN_TEXT}: {drain_why}"
    line.update(budgets or {})
    if budgets and "budgets_not_evaluated" in budgets:
        print(f"warning: {event.event_id}: {budgets['budgets_not_evaluated']}", file=sys.stderr)
    print(json.dumps(line))


def _drain_plan() -> str:
    """Which drain applies with this environment's DRAIN__* settings (plan.drain_summary)."""
    from pydantic import ValidationError

    from functions.terminate.plan import drain_summary
    from functions.terminate.settings import DrainSettings

    try:
        drain = DrainSettings()
    except ValidationError as exc:
        return f"DRAIN__* invalid ({exc.error_count()} error(s)): see `settings check`"
    return drain_summary(drain)


def _vm_drain(args: argparse.Namespace | None) -> tuple[DrainKind | None, str]:
    """The drain the VM has: --drain, else "none" where the DRAIN__* settings give no VM
    a drain step (no HTTP drain, no relay hook, the readiness drain off), else unknown
    (None: the drain workflow finds out, VM by VM)."""
    given: DrainKind | None = getattr(args, "drain", None)
    if given:
        return given, "--drain none"
    from pydantic import ValidationError

    from functions.terminate.plan import relay_drain
    from functions.terminate.settings import DrainSettings

    try:
        settings = DrainSettings()
    except ValidationError:
        return None, ""
    if settings.http_url or relay_drain(settings) is not None:
        return None, ""
    return NO_DRAIN_KIND, "DRAIN__HTTP_URL and DRAIN__RELAY_HOOK unset, DRAIN__READINESS=false"


def _untagged(load, decided_by: str) -> list[str]:
    """Rules tried before the deciding one (and it) with a `tags` criterion, when the VM's
    tags were not given (--tag): they could not match."""
    if load.policy is None:
        return []
    names = []
    for rule in load.policy.rules:
        if rule.match.tags is not None:
            names.append(f"rule {rule.name!r} (tags) not evaluated")
        if rule.name == decided_by:
            break
    return names


def _unevaluated(load, decided_by: str, scale_sets: tuple[str, ...], known: bool) -> list[str]:
    """Rules tried before the deciding one (and it) whose `scale_sets` criterion this
    input cannot answer: no set given and none in the input."""
    if known or scale_sets or load.policy is None:
        return []
    names = []
    for rule in load.policy.rules:
        if rule.match.scale_sets is not None:
            names.append(f"rule {rule.name!r} (scale_sets) not evaluated")
        if rule.name == decided_by:
            break
    return names


if __name__ == "__main__":
    sys.exit(main())
