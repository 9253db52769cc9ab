"""What a redeploy from a parameter file would change in the deployment that runs now.

A deployment writes every parameter: one the file does not set takes the template's
default. The documented first deploy once passed the existing VNet, `vmScopes` and the
operators' sign-in on the command line, and every later documented deploy passed only
`main.bicepparam`, so a redeploy, taken literally, made a new VNet, turned the pages off
and shrank `vmScopes` (issue 45). Every value now lives in the one file from the first
deploy on, and `settings check --file infra/main.bicepparam --deployed FILE` says, value by
value, what a redeploy from the file would change, against either:

- the last deployment's parameters: `az deployment group show -g RG -n NAME --query
  properties.parameters > deployed.json` ({"name": {"type": ..., "value": ...}}; secure
  parameters carry no value there and are not compared);
- or the app's settings: `az functionapp config appsettings list -g RG -n APP >
  deployed.json`, compared for the settings the template writes (functions.bicepparam).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from functions.bicepparam import TEMPLATE_SETTINGS, ParameterFile

MAX_SHOWN = 120  # characters of a value shown


class DeployedError(ValueError):
    """The deployed values cannot be read; the message says why."""


def read_deployed(path: str) -> tuple[str, dict[str, Any]]:
    """("parameters", name -> value) or ("settings", name -> value) from `path`."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DeployedError(f"{path}: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("properties"), dict):
        data = data["properties"].get("parameters", data)  # a whole `deployment show`
    if (
        isinstance(data, dict)
        and data
        and all(isinstance(v, dict) and ("type" in v or "value" in v) for v in data.values())
    ):
        return "parameters", {k: v["value"] for k, v in data.items() if "value" in v}
    if isinstance(data, list) and all(isinstance(i, dict) and "name" in i for i in data):
        return "settings", {str(i["name"]): i.get("value") for i in data}
    if isinstance(data, dict) and isinstance(data.get("Values"), dict):
        return "settings", dict(data["Values"])
    raise DeployedError(
        f"{path}: expected `az deployment group show ... --query properties.parameters` "
        "output or `az functionapp config appsettings list` output"
    )


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def changes(parsed: ParameterFile, kind: str, deployed: dict[str, Any]) -> list[str]:
    """Each value a redeploy from `parsed` would change, in words, names sorted."""
    if kind == "parameters":
        return _parameter_changes(parsed, deployed)
    return _setting_changes(parsed, deployed)


def _parameter_changes(parsed: ParameterFile, deployed: dict[str, Any]) -> list[str]:
    out = []
    errors = {name for name, _ in parsed.errors}
    for name in sorted(deployed, key=str.casefold):
        was = deployed[name]
        if name in errors:
            continue  # said as the file's error
        if name not in parsed.params:
            out.append(
                f"{name}: deployed {_shown(was)}; the file does not set it, so a redeploy "
                "writes the template's default"
            )
        elif parsed.params[name] != was:
            out.append(f"{name}: deployed {_shown(was)}, the file {_shown(parsed.params[name])}")
    return out


def _setting_changes(parsed: ParameterFile, deployed: dict[str, Any]) -> list[str]:
    out = []
    folded = {str(k).casefold(): v for k, v in deployed.items()}
    for param, mapped in sorted(TEMPLATE_SETTINGS.items(), key=lambda kv: kv[1].setting):
        setting = mapped.setting
        was = folded.get(setting.casefold())
        will = parsed.settings.get(setting)
        if isinstance(was, str) and was.startswith("@Microsoft.KeyVault("):
            continue  # a secret's reference: the same reference is written again
        if was is None and will is None:
            continue
        if will is None:
            out.append(
                f"{setting} ({param}): deployed {_shown(was)}; the file leaves it out, so a "
                "redeploy removes it"
            )
        elif was is None:
            out.append(f"{setting} ({param}): not deployed; the file sets {_shown(will)}")
        elif _same_setting(str(was), will):
            continue
        else:
            out.append(f"{setting} ({param}): deployed {_shown(was)}, the file {_shown(will)}")
    return out


def _same_setting(was: str, will: str) -> bool:
    """Equal as the app reads them: JSON values compare as JSON, booleans case-blind."""
    if was == will:
        return True
    if was.casefold() in ("true", "false") and was.casefold() == will.casefold():
        return True
    try:
        return json.loads(was) == json.loads(will)
    except (json.JSONDecodeError, TypeError):
        return False
