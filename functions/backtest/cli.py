"""`python -m functions policy backtest [--policy FILE] [--since 30d] [SOURCE] [--json]`.

SOURCE is one of:
- (default) the events table, read with the app's own settings: `StateStorage` (a
  connection string) or `StateStorage__accountName` (your Azure sign-in), and
  `STATE_TABLE_PREFIX`, from this environment or from `--settings FILE` (what `az
  functionapp config appsettings list` or local.settings.json holds, as for `settings
  check`);
- `--graph FILE`: `az graph query -q "maintenanceresources | where type ==
  'microsoft.maintenance/scheduledevents'" --first 1000 > FILE`;
- `--documents PATH...`: relay envelopes (files or directories of *.json, JSON Lines too).

With disruption budgets in the candidate, they are replayed too (functions.backtest.budgets):
where Azure places each VM comes from `--placements FILE` (an `az graph query` export of
the VMs' tags and zones), else, replaying the events table, from the placements the
identity sync stored beside it; a VM neither places counts only in its event's set.

The candidate policy is `--policy FILE`, else the `POLICY__*` settings (of the environment,
or of `--settings FILE`), as `policy explain` reads them. Exit 0 when every record was
replayed, 2 on unusable input (a policy that does not validate, a file that is not what it
should be) or when some record could not be replayed (listed, with the reason).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from functions.backtest.history import (
    HistoryError,
    Past,
    Skipped,
    from_documents,
    from_graph,
    parse_since,
    read_json,
)
from functions.backtest.render import dumps, render_text
from functions.backtest.replay import Backtest, replay
from functions.backtest.table import from_store
from functions.bicepparam import ParameterFileError, is_parameter_file, read_parameter_file
from functions.model.budgets import effective_budgets, lint_budgets
from functions.model.policy import (
    POLICY_FAMILY,
    Policy,
    PolicyLoad,
    default_rules,
    load_policy,
    summarize,
)
from functions.model.policy_lint import lint_rules


class CandidateError(ValueError):
    """The candidate policy cannot be used; the message says why."""


def add_parser(policy_commands: argparse._SubParsersAction) -> None:
    backtest = policy_commands.add_parser(
        "backtest",
        help="replay past events through a candidate policy",
        description="Replay real history through a candidate policy: per event, what it "
        "would have decided beside what was decided; the worst concurrent impact per set; "
        "the holds that would have run to NotBefore.",
    )
    backtest.add_argument(
        "--policy",
        metavar="FILE",
        help='the candidate: JSON as `policy check` prints it ({"rules": [...], ...}), a '
        "list of rules, or app settings holding POLICY__* (default: the POLICY__* settings)",
    )
    backtest.add_argument(
        "--file",
        metavar="FILE",
        help="the candidate of a parameter file (infra/main.bicepparam: its policy "
        "parameters, as a deployment writes them); the same as --policy FILE",
    )
    backtest.add_argument(
        "--since", default="30d", help="how far back: 30d (default), 12h, 90m or an ISO date"
    )
    source = backtest.add_mutually_exclusive_group()
    source.add_argument(
        "--graph",
        metavar="FILE",
        help="an exported Resource Graph result (`az graph query` JSON); - for stdin",
    )
    source.add_argument(
        "--documents",
        metavar="PATH",
        nargs="+",
        help="relay envelopes: files or directories of *.json (the demo's inbox/processed)",
    )
    backtest.add_argument(
        "--settings",
        metavar="FILE",
        help="app settings (as for `settings check --file`): the events table's connection "
        "and STATE_TABLE_PREFIX, and the POLICY__* settings unless --policy is given",
    )
    backtest.add_argument(
        "--placements",
        metavar="FILE",
        help="for budgets: the VMs' tags and zones, `az graph query -q \"resources | where "
        "type =~ 'microsoft.compute/virtualmachines' | project id, subscriptionId, tags, "
        'zones, ..."` (docs/policy.md)',
    )
    backtest.add_argument("--now", help="ISO time the window ends at (default: now)")
    backtest.add_argument("--json", action="store_true", help="one JSON object")


def run(args: argparse.Namespace) -> int:
    try:
        now = _now(args.now)
        since = parse_since(args.since, now)
        if args.settings:
            _load_settings_file(args.settings)
        if args.file and args.policy and args.file != args.policy:
            raise CandidateError("give the candidate once: --file or --policy")
        load, policy_source = candidate(args.policy or args.file)
        pasts, skipped, source = _history(args, since)
        assert load.policy is not None
        result = replay(
            load.policy,
            pasts,
            source=source,
            policy_source=policy_source,
            since=since,
            now=now,
            drain_configured=drain_configured(),
            skipped=skipped,
        )
        if load.policy.budgets:
            result.budgets = _budgets(load.policy, result, args.placements, source)
    except (HistoryError, CandidateError) as exc:
        print(f"backtest: {exc}", file=sys.stderr)
        return 2
    for warning in load.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(dumps(result) if args.json else render_text(result))
    errors = [s for s in result.skipped if s.error]
    for bad in errors:
        print(f"backtest: not replayed: {bad.where}: {bad.reason}", file=sys.stderr)
    return 2 if errors else 0


def _budgets(policy: Policy, result: Backtest, export: str | None, source: str) -> Any:
    """The candidate's budgets replayed, with placements from `export`, else (the events
    table) the identity sync's rows beside it, else none (each event's own set)."""
    from functions.backtest.budgets import read_placements, replay_budgets, sizes_of

    budgets = effective_budgets(policy.budgets, policy.max_concurrent_per_set)
    if export:
        found = read_placements(export)
        everyone = [p for ps in found.values() for p in ps]
        return replay_budgets(
            policy.budgets,
            policy.max_concurrent_per_set,
            result.events,
            lambda vm: found.get(vm.casefold()),
            sizes_of(budgets, everyone),
        )
    if source == "table":
        placements = _synced_placements()
        cache: dict[str, Any] = {}

        def placed(vm: str) -> Any:
            if vm.casefold() not in cache:
                cache[vm.casefold()] = placements.for_name(vm)
            return cache[vm.casefold()]

        return replay_budgets(
            policy.budgets, policy.max_concurrent_per_set, result.events, placed, placements.size
        )
    return replay_budgets(
        policy.budgets, policy.max_concurrent_per_set, result.events, lambda vm: None, {}
    )


def _synced_placements() -> Any:
    from functions.identity.registry import TABLE_SUFFIX
    from functions.store.placements import Placements

    store = _store()
    return Placements(store.service.get_table_client(f"{store.prefix}{TABLE_SUFFIX}"))


def _now(text: str | None) -> datetime:
    if not text:
        return datetime.now(UTC)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise HistoryError(f"--now {text!r}: not an ISO time like 2026-11-27T10:00:00Z") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _load_settings_file(path: str) -> None:
    from functions.settings_cli import SettingsFileError, read_settings_file

    try:
        values = read_settings_file(path)
    except SettingsFileError as exc:
        raise HistoryError(str(exc)) from None
    for name, value in values.items():
        os.environ[name] = value


def _history(args: argparse.Namespace, since: datetime) -> tuple[list[Past], list[Skipped], str]:
    if args.graph:
        pasts, skipped = from_graph(args.graph, since)
        return pasts, skipped, "graph"
    if args.documents:
        pasts, skipped = from_documents(args.documents, since)
        return pasts, skipped, "documents"
    pasts, skipped = from_store(_store(), since)
    return pasts, skipped, "table"


def _store() -> Any:
    """The app's Store over the events table, as the app's settings name it (read only)."""
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    from functions.settings import SettingsInvalid, load_settings
    from functions.store.state import Store

    try:
        settings = load_settings()
        settings.table_connection()
        store = Store.from_settings(settings)
        store.events.get_table_access_policy()  # fails fast: wrong account, no table, no access
    except SettingsInvalid as exc:
        raise HistoryError(
            f"{exc}; or give --graph FILE or --documents PATH to replay another history"
        ) from None
    except ResourceNotFoundError:
        raise HistoryError(
            f"events table: no table {settings.state_table_prefix}events in that account: "
            "check StateStorage and STATE_TABLE_PREFIX"
        ) from None
    except AzureError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HistoryError(f"events table: cannot read it: {first[:300]}") from None
    except ValueError as exc:  # a connection string the SDK cannot parse
        raise HistoryError(f"events table: StateStorage: {exc}") from None
    return store


def drain_configured() -> bool:
    """Whether a `drain` here has a step to run (DRAIN__HTTP_URL, DRAIN__RELAY_HOOK, or the
    readiness probe, DRAIN__READINESS, on by default); the app holds a drain until
    NotBefore when it has none."""
    from functions.terminate.settings import DrainSettings

    try:
        drain = DrainSettings()
    except ValidationError:
        return False
    return bool(drain.http_url or drain.relay_hook or drain.readiness)


# --------------------------------------------------------------------------- the candidate


def candidate(path: str | None) -> tuple[PolicyLoad, str]:
    """The candidate policy and words naming it; CandidateError when it does not validate
    (with the app's own refusals: unknown fields, Azure's closed sets, rule ordering)."""
    if path is None:
        load = load_policy()
        if load.policy is None:
            raise CandidateError(f"the POLICY__* settings are invalid: {load.error}")
        named = any(k.upper().startswith(POLICY_FAMILY) for k in os.environ)
        return load, "the POLICY__* settings" if named else "the default policy (no POLICY__*)"
    if is_parameter_file(path):
        return _from_parameter_file(path), f"the policy parameters of {path}"
    data = read_json(path, "a policy")
    if _is_settings(data):
        return _from_settings(path), f"the POLICY__* settings in {path}"
    if isinstance(data, list):
        data = {"rules": data}
    if not isinstance(data, dict):
        raise CandidateError(
            f"{path}: not a policy: expected an object like `policy check` prints, a list of "
            "rules, or app settings"
        )
    if data.get("rules") == []:
        data = {**data, "rules": default_rules()}
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        raise CandidateError(f"{path}: not a valid policy: {summarize(exc)}") from None
    errors, warnings = lint_rules(policy.rules)
    budget_errors, budget_warnings = lint_budgets(policy.budgets)
    if errors or budget_errors:
        raise CandidateError(f"{path}: {'; '.join([*errors, *budget_errors])}")
    return PolicyLoad(policy=policy, warnings=(*warnings, *budget_warnings)), path


def _is_settings(data: Any) -> bool:
    if isinstance(data, dict):
        keys = data["Values"] if isinstance(data.get("Values"), dict) else data
        return any(str(k).upper().startswith(POLICY_FAMILY) for k in keys)
    if isinstance(data, list) and data and all(isinstance(i, dict) for i in data):
        return all(set(i) >= {"name", "value"} for i in data)
    return False


def _from_settings(path: str) -> PolicyLoad:
    from functions.settings_cli import SettingsFileError, read_settings_file

    try:
        values = read_settings_file(path)
    except SettingsFileError as exc:
        raise CandidateError(str(exc)) from None
    policy_values = {k: v for k, v in values.items() if k.upper().startswith(POLICY_FAMILY)}
    with _policy_environment(policy_values):
        load = load_policy()
    if load.policy is None:
        raise CandidateError(f"{path}: the POLICY__* settings are invalid: {load.error}")
    return load


def _from_parameter_file(path: str) -> PolicyLoad:
    """The POLICY__* settings a deployment from this parameter file writes (its
    `policy*` parameters, functions.bicepparam), checked as the app checks them."""
    try:
        parsed = read_parameter_file(path)
    except ParameterFileError as exc:
        raise CandidateError(str(exc)) from None
    values = {k: v for k, v in parsed.settings.items() if k.upper().startswith(POLICY_FAMILY)}
    with _policy_environment(values):
        load = load_policy()
    if load.policy is None:
        raise CandidateError(f"{path}: the policy parameters are invalid: {load.error}")
    return load


@contextlib.contextmanager
def _policy_environment(values: dict[str, str]) -> Iterator[None]:
    """This process's POLICY_* variables replaced by `values` for the duration."""
    saved = {k: v for k, v in os.environ.items() if k.upper().startswith(POLICY_FAMILY)}
    for name in saved:
        del os.environ[name]
    os.environ.update(values)
    try:
        yield
    finally:
        for name in values:
            os.environ.pop(name, None)
        os.environ.update(saved)


def backtest_store(
    store: Any, policy: Policy, since: datetime, now: datetime, **kw: Any
) -> Backtest:
    """The events table's backtest as a library call (the demo's, on its own history)."""
    pasts, skipped = from_store(store, since)
    result = replay(policy, pasts, source="table", since=since, now=now, skipped=skipped, **kw)
    if policy.budgets:
        from functions.backtest.budgets import replay_budgets
        from functions.identity.registry import TABLE_SUFFIX
        from functions.store.placements import Placements

        placements = Placements(store.service.get_table_client(f"{store.prefix}{TABLE_SUFFIX}"))
        result.budgets = replay_budgets(
            policy.budgets,
            policy.max_concurrent_per_set,
            result.events,
            placements.for_name,
            placements.size,
        )
    return result
