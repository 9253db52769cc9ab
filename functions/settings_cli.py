"""`python -m functions settings check [--strict] [--file FILE] [--local]`.

Prints one line per finding (`error: ...`, `warning: ...`) and exits 2 when there is an
error (with `--strict`, a warning too), 0 otherwise. `--file` reads exported app settings
(`az functionapp config appsettings list` or local.settings.json), or the settings a
deployment from a `.bicepparam` would write (functions.bicepparam), into this process's
environment first, so the app's own models read them exactly as they would in Azure. Each
run says where the policy came from (`policy check` too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from functions.bicepparam import ParameterFileError, is_parameter_file, read_parameter_file
from functions.model.policy import POLICY_FAMILY
from functions.settings import KEY_VAULT_REFERENCE_PREFIX
from functions.settings_check import check_settings, trust_notice

# What an exported Key Vault reference is checked as: App Service resolves the reference,
# this process cannot, so the value is not checked (and the output says so).
UNCHECKED_SECRET = "key-vault-reference-not-checked-offline"  # noqa: S105


class SettingsFileError(ValueError):
    pass


def read_settings_file(path: str) -> dict[str, str]:
    """Name -> value from `az functionapp config appsettings list` ([{"name", "value"}]),
    local.settings.json ({"Values": {...}}) or a plain JSON object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SettingsFileError(f"{path}: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("Values"), dict):
        data = data["Values"]
    if isinstance(data, list):
        try:
            data = {item["name"]: item.get("value") for item in data}
        except (TypeError, KeyError):
            raise SettingsFileError(f"{path}: a list, but not of {{name, value}}") from None
    if not isinstance(data, dict):
        raise SettingsFileError(f"{path}: not a JSON object or a list of settings")
    _looks_like_settings(path, data)
    return {str(k): "" if v is None else str(v) for k, v in data.items()}


def _looks_like_settings(path: str, data: dict) -> None:
    """Refuse a JSON object that is not app settings (an IMDS document, an ARM export):
    settings are names with plain values, and at least one is a name the app or the
    platform reads. Checked without it, such a file would say "settings OK"."""
    from functions.settings_check import app_prefixes, known_names, settings_models

    shape = (
        "expected app settings: `az functionapp config appsettings list` output "
        '([{"name", "value"}, ...]), local.settings.json ({"Values": {...}}) or '
        '{"NAME": "value", ...}'
    )
    if not data:
        raise SettingsFileError(f"{path}: no settings in it; {shape}")
    nested = sorted(str(k) for k, v in data.items() if isinstance(v, (dict, list)))
    if nested:
        raise SettingsFileError(
            f"{path}: not app settings: {', '.join(nested[:5])} hold(s) a JSON object or list, "
            f"and a setting's value is a string; {shape}"
        )
    models = settings_models()
    known = {n.casefold() for n in known_names(models)}
    prefixes = tuple(app_prefixes(models))
    platform = ("FUNCTIONS_", "AZUREWEBJOBS", "WEBSITE_", "APPLICATIONINSIGHTS_")
    if not any(
        str(k).casefold() in known or str(k).upper().startswith((*prefixes, *platform))
        for k in data
    ):
        names = ", ".join(sorted(str(k) for k in data)[:5])
        raise SettingsFileError(
            f"{path}: not app settings: no name in it ({names}) is one the app or the "
            f"Functions platform reads; {shape}"
        )


@dataclass
class LoadedFile:
    """A settings file put into this process's environment, and what it said on the way."""

    label: str
    notes: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (setting, why)
    alert_receivers: bool | None = None
    origin: dict[str, str] = field(default_factory=dict)  # setting -> where it came from


def load_file(path: str) -> LoadedFile:
    """Put `path`'s settings into os.environ, as the app would read them in Azure.

    App settings (JSON) go on top of the environment. A `.bicepparam` is what a deployment
    from it writes: every app setting of this shell is dropped first (the deployment writes
    its own), after its `readEnvironmentVariable`s were read."""
    if is_parameter_file(path):
        return _load_parameter_file(path)
    values = read_settings_file(path)
    loaded = LoadedFile(label=path)
    for name, value in values.items():
        if value.strip().casefold().startswith(KEY_VAULT_REFERENCE_PREFIX.casefold()):
            loaded.notes.append(
                f"{name}: a Key Vault reference; App Service resolves it, not checked"
            )
            value = UNCHECKED_SECRET
        os.environ[name] = value
        loaded.origin[name] = path
    return loaded


def _load_parameter_file(path: str) -> LoadedFile:
    from functions.settings_check import app_prefixes, known_names, settings_models

    try:
        parsed = read_parameter_file(path)
    except ParameterFileError as exc:
        raise SettingsFileError(str(exc)) from None
    models = settings_models()
    known = {n.casefold() for n in known_names(models)}
    prefixes = tuple(app_prefixes(models))
    for name in list(os.environ):
        if name.casefold() in known or name.upper().startswith(prefixes):
            del os.environ[name]
    os.environ.update(parsed.settings)
    return LoadedFile(
        label=path,
        notes=parsed.notes,
        errors=parsed.errors,
        alert_receivers=parsed.alert_receivers,
        origin={s: f"{path}: {p}" for s, p in parsed.origin.items()},
    )


def policy_source(loaded: LoadedFile | None = None) -> str:
    """Where the policy in this environment comes from: each POLICY__* setting and its
    source, and whether the rules are the default policy (drain, then approve)."""
    origin = loaded.origin if loaded else {}
    names = sorted(n for n in os.environ if n.upper().startswith(POLICY_FAMILY))
    given = [f"{n} from {origin.get(n, 'an environment variable')}" for n in names]
    if not any(n.upper() == "POLICY__RULES" for n in names):
        if loaded and is_parameter_file(loaded.label):
            why = f"policyRules is empty or not set in {loaded.label}"
        else:
            where = f"{loaded.label} or " if loaded and loaded.label != "environment" else ""
            why = (
                f"no POLICY__RULES in {where}this environment; a shell variable set "
                "without `export` is not in it"
            )
        given.insert(0, f"the rules are the default policy, drain then approve ({why})")
    return "policy from: " + "; ".join(given)


def run_settings_check(args: argparse.Namespace) -> int:
    shell = dict(os.environ)  # before a parameter file replaces its app settings
    loaded = LoadedFile(label="environment")
    if args.file:
        try:
            loaded = load_file(args.file)
        except SettingsFileError as exc:
            print(f"settings: {exc}", file=sys.stderr)
            return 2
    report = check_settings(for_azure=not args.local, alert_receivers=loaded.alert_receivers)
    for note in loaded.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"note: {policy_source(loaded)}", file=sys.stderr)
    for setting, why in loaded.errors:
        print(f"error: {setting}: {why}", file=sys.stderr)
    for finding in report.findings:
        if finding.setting == "connections" and "appSecret" in dict(loaded.errors):
            continue  # said above, as the parameter file's
        print(f"{finding.severity}: {finding}", file=sys.stderr)
    refused = len(loaded.errors) + sum(
        1
        for f in report.errors()
        if not (f.setting == "connections" and "appSecret" in dict(loaded.errors))
    )
    warnings = report.warnings()
    notice = trust_notice()
    if notice:  # Microsoft's date, not the deployment's fault: never an error under --strict
        print(f"notice: trust: {notice}", file=sys.stderr)
    changed = _redeploy_changes(args, shell)
    if changed is None:
        return 2
    warned = len(warnings) + len(changed)
    if refused:
        print(
            f"settings invalid: {refused} error(s): the app refuses to act on them "
            "(it fails closed: nothing approved, policy_invalid announced)"
            if not loaded.errors
            else f"settings invalid: {refused} error(s)",
            file=sys.stderr,
        )
        return 2
    if args.strict and warned:
        print(
            f"settings not clean: {warned} warning(s) (--strict); the app would run "
            "with them and log them at start",
            file=sys.stderr,
        )
        return 2
    print(f"settings OK ({warned} warning(s)); {len(report.models)} settings models read")
    return 0


def _redeploy_changes(args: argparse.Namespace, shell: dict[str, str]) -> list[str] | None:
    """With --deployed: each value a redeploy from the parameter file would change, printed
    as a warning (functions.redeploy); None when --deployed cannot be used (said)."""
    deployed = getattr(args, "deployed", None)
    if not deployed:
        return []
    from functions.redeploy import DeployedError, changes, read_deployed

    if not (args.file and is_parameter_file(args.file)):
        print("settings: --deployed needs --file main.bicepparam to compare", file=sys.stderr)
        return None
    try:
        kind, values = read_deployed(deployed)
        parsed = read_parameter_file(args.file, shell)
    except (DeployedError, ParameterFileError) as exc:
        print(f"settings: {exc}", file=sys.stderr)
        return None
    found = changes(parsed, kind, values)
    if not found:
        print(f"note: a redeploy from {args.file} changes nothing deployed", file=sys.stderr)
    for line in found:
        print(f"warning: a redeploy from {args.file} changes {line}", file=sys.stderr)
    return found
