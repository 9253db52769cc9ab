"""`python -m functions settings check [--strict] [--file FILE] [--local]`.

Prints one line per finding (`error: ...`, `warning: ...`) and exits 2 when there is an
error (with `--strict`, a warning too), 0 otherwise. `--file` reads exported app settings
(`az functionapp config appsettings list` or local.settings.json) into this process's
environment first, so the app's own models read them exactly as they would in Azure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from functions.settings import KEY_VAULT_REFERENCE_PREFIX
from functions.settings_check import check_settings

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


def run_settings_check(args: argparse.Namespace) -> int:
    notes = []
    if args.file:
        try:
            values = read_settings_file(args.file)
        except SettingsFileError as exc:
            print(f"settings: {exc}", file=sys.stderr)
            return 2
        for name, value in values.items():
            if value.strip().casefold().startswith(KEY_VAULT_REFERENCE_PREFIX.casefold()):
                notes.append(f"{name}: a Key Vault reference; App Service resolves it, not checked")
                value = UNCHECKED_SECRET
            os.environ[name] = value
    report = check_settings(for_azure=not args.local)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for finding in report.findings:
        print(f"{finding.severity}: {finding}", file=sys.stderr)
    refused = report.errors()
    warnings = report.warnings()
    if refused:
        print(
            f"settings invalid: {len(refused)} error(s): the app refuses to act on them "
            "(it fails closed: nothing approved, policy_invalid announced)",
            file=sys.stderr,
        )
        return 2
    if args.strict and warnings:
        print(
            f"settings not clean: {len(warnings)} warning(s) (--strict); the app would run "
            "with them and log them at start",
            file=sys.stderr,
        )
        return 2
    print(f"settings OK ({len(warnings)} warning(s)); {len(report.models)} settings models read")
    return 0
