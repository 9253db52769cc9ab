"""The app settings a deployment from a `.bicepparam` file would write, read offline.

`settings check --file infra/main.bicepparam` and `policy check --file ...` check the policy
and the channels where the docs tell operators to keep them, before a deployment writes them
(a typo there used to deploy, and the app failed closed). The file is parsed with
pycep-parser (requirements-dev.txt; imported only here, so the function app never needs it)
and evaluated as Bicep evaluates a parameter file: literals, `readEnvironmentVariable(NAME[,
DEFAULT])` from this shell (the worked example's secrets), `bool()`, `int()`, `string()`,
`json()`. A parameter set by another expression is not evaluated: its setting is left out and
a note says so.

`TEMPLATE_SETTINGS` is what infra/modules/functionapp.bicep writes from each parameter
(tests/infra/test_parameter_file.py holds it to the template). A parameter the file leaves
out gets main.bicep's default, which is the app's own default; the connections and the
storage names the template makes itself are not the file's to get wrong.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Render = Literal["text", "json", "bool", "csv", "positive"]


@dataclass(frozen=True)
class Mapped:
    setting: str
    render: Render = "text"
    # The template leaves the setting out when the parameter is empty (the app's default,
    # or the channel off).
    omitted_when_empty: bool = False


TEMPLATE_SETTINGS: dict[str, Mapped] = {
    "policyRules": Mapped("POLICY__RULES", "json", omitted_when_empty=True),
    "policyDryRun": Mapped("POLICY__DRY_RUN", "bool"),
    "policyWindows": Mapped("POLICY__WINDOWS", "json"),
    "policyTimezone": Mapped("POLICY__TIMEZONE"),
    "policyMaxConcurrentPerSet": Mapped("POLICY__MAX_CONCURRENT_PER_SET"),
    "policyBudgets": Mapped("POLICY__BUDGETS", "json"),
    "drainHttpUrl": Mapped("DRAIN__HTTP_URL", omitted_when_empty=True),
    "drainRelayHook": Mapped("DRAIN__RELAY_HOOK", omitted_when_empty=True),
    "undrainHttpUrl": Mapped("UNDRAIN__HTTP_URL", omitted_when_empty=True),
    "undrainRelayHook": Mapped("UNDRAIN__RELAY_HOOK", omitted_when_empty=True),
    "drainOnFailure": Mapped("DRAIN__ON_FAILURE"),
    "attestationMode": Mapped("ATTESTATION_MODE"),
    "relaySilentAfterSeconds": Mapped("RELAY_SILENT_AFTER_SECONDS"),
    "approvalMarginSeconds": Mapped("APPROVAL_MARGIN_SECONDS"),
    "relayCallbackPort": Mapped("RELAY_CALLBACK_PORT"),
    # The relays' readiness probe port: a drain goes through it only where relays serve it.
    "relayReadyPort": Mapped("DRAIN__READINESS", "positive"),
    "publicBaseUrl": Mapped("PUBLIC_BASE_URL", omitted_when_empty=True),
    "operatorsGroupId": Mapped("OPERATORS_GROUP_ID", omitted_when_empty=True),
    "operatorsAppRole": Mapped("OPERATORS_APP_ROLE", omitted_when_empty=True),
    # Empty: main.bicep derives them (from acknowledgeScopes, vmScopes); checked as unset.
    "approvers": Mapped("APPROVERS", omitted_when_empty=True),
    "allowedSubscriptions": Mapped("ALLOWED_SUBSCRIPTIONS", "csv", omitted_when_empty=True),
    # Secrets: stored in Key Vault, the app setting a reference to them.
    "appSecret": Mapped("APP_SECRET"),
    "appSecretPrevious": Mapped("APP_SECRET_PREVIOUS", omitted_when_empty=True),
    "pagerdutyRoutingKey": Mapped("PAGERDUTY_ROUTING_KEY", omitted_when_empty=True),
    "teamsWebhookUrl": Mapped("TEAMS_WEBHOOK_URL", omitted_when_empty=True),
    "slackWebhookUrl": Mapped("SLACK_WEBHOOK_URL", omitted_when_empty=True),
    "webhookUrl": Mapped("WEBHOOK_URL", omitted_when_empty=True),
    "webhookSecret": Mapped("WEBHOOK_SECRET", omitted_when_empty=True),
    "webhookSecretPrevious": Mapped("WEBHOOK_SECRET_PREVIOUS", omitted_when_empty=True),
}
# Made by the template from its own resources (identity-based connections).
TEMPLATE_MADE = {
    "ServiceBusConnection__fullyQualifiedNamespace": "made-by-the-template.servicebus.windows.net",
    "StateStorage__accountName": "madebythetemplate",
    "AzureWebJobsStorage__accountName": "madebythetemplate",
}
EXAMPLES = ("deployExampleScaleSet", "deployExampleVm")


class ParameterFileError(ValueError):
    pass


@dataclass
class ParameterFile:
    """What a deployment from the file would write, and what the file alone shows."""

    path: str
    params: dict[str, Any] = field(default_factory=dict)  # evaluated; absent: not evaluated
    settings: dict[str, str] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # setting -> the parameter it is from
    notes: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (parameter, why)

    @property
    def alert_receivers(self) -> bool:
        receivers = ("alertEmail", "alertActionGroupId")
        return any(str(self.params.get(p) or "").strip() for p in receivers)


class _Unset:
    """readEnvironmentVariable of a variable this shell does not have, without a default."""

    def __init__(self, name: str) -> None:
        self.name = name


class _NotEvaluated:
    def __init__(self, what: str) -> None:
        self.what = what


def is_parameter_file(path: str) -> bool:
    return path.casefold().endswith(".bicepparam")


def read_parameter_file(path: str, environ: dict[str, str] | None = None) -> ParameterFile:
    env = dict(os.environ if environ is None else environ)
    raw = _parse(path)
    result = ParameterFile(path=path)
    for name, node in raw.items():
        value = _evaluate(node, env)
        if isinstance(value, _Unset):
            result.errors.append(
                (
                    name,
                    f"readEnvironmentVariable('{value.name}') has no default and {value.name} is "
                    "not set in this shell: the deployment stops at this file (export it)",
                )
            )
        elif isinstance(value, _NotEvaluated):
            result.notes.append(f"{name}: {value.what}, not evaluated offline: not checked")
        else:
            result.params[name] = value
    for name, mapped in TEMPLATE_SETTINGS.items():
        if name not in result.params:
            continue
        text = _render(result.params[name], mapped.render)
        if mapped.omitted_when_empty and not text.strip("[]{} "):
            continue
        result.settings[mapped.setting] = text
        result.origin[mapped.setting] = name
    result.settings.update(TEMPLATE_MADE)
    _example_key(result, raw)
    return result


def _example_key(result: ParameterFile, raw: dict[str, Any]) -> None:
    """main.bicep asks for adminSshPublicKey only when an example machine is deployed."""
    examples = [p for p in EXAMPLES if result.params.get(p) is True]
    key = result.params.get("adminSshPublicKey", "" if "adminSshPublicKey" not in raw else None)
    if examples and isinstance(key, str) and not key.strip():
        result.errors.append(
            (
                "adminSshPublicKey",
                f"empty while {' and '.join(examples)} is true: the deployment fails (export "
                f"SSH_PUBLIC_KEY, or set {examples[0]} = false)",
            )
        )


def _parse(path: str) -> dict[str, Any]:
    """`param NAME = VALUE` of the file, as pycep-parser's tree (a parameter file is read as
    variables: pycep parses templates, whose `var` takes the same values)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParameterFileError(f"{path}: {exc}") from None
    try:
        from pycep import BicepParser
    except ImportError:
        raise ParameterFileError(
            f"{path}: reading a .bicepparam needs pycep-parser (requirements-dev.txt; "
            "`make install` puts it in .venv)"
        ) from None
    names = re.findall(r"^param\s+(\w+)\s*=", text, re.M)
    if not names:
        raise ParameterFileError(f"{path}: no `param NAME = value` in it")
    lines = [
        re.sub(r"^param(\s+\w+\s*=)", r"var\1", line)
        for line in text.splitlines()
        if not re.match(r"^(using|extends)\s", line)
    ]
    try:
        tree = BicepParser().parse(text="\n".join(lines) + "\n")
    except Exception as exc:  # lark's errors: the position and what it expected
        raise ParameterFileError(
            f"{path}: not a parameter file pycep-parser can read: {exc}"
        ) from None
    variables = tree.get("variables", {})
    return {name: variables[name]["value"] for name in names if name in variables}


_ESCAPES = {"\\": "\\", "'": "'", "n": "\n", "r": "\r", "t": "\t", "$": "$", "{": "{"}


def _string(text: str) -> Any:
    """A Bicep string literal's value (pycep keeps the escapes); `${...}` is interpolation."""
    if re.search(r"(?<!\\)\$\{", text):
        return _NotEvaluated("an interpolated string")
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), text)


def _evaluate(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return _string(node)
    if isinstance(node, list):
        items = [_evaluate(n, env) for n in node]
        return next((i for i in items if isinstance(i, (_Unset, _NotEvaluated))), items)
    if not isinstance(node, dict):
        return node
    if "function" in node:
        return _call(node["function"]["type"], list(node["function"]["parameters"].values()), env)
    if "operator" in node:
        op = node["operator"]
        if op.get("type") == "minus" and set(op.get("operands", {})) == {"integer_value"}:
            return -int(op["operands"]["integer_value"])
        return _NotEvaluated(f"an expression ({op.get('type')})")
    out = {}
    for key, value in node.items():
        out[key] = _evaluate(value, env)
        if isinstance(out[key], (_Unset, _NotEvaluated)):
            return out[key]
    return out


def _call(name: str, args: list[Any], env: dict[str, str]) -> Any:
    values = [_evaluate(a, env) for a in args]
    stuck = next((v for v in values if isinstance(v, (_Unset, _NotEvaluated))), None)
    if stuck is not None:
        return stuck
    if name == "readEnvironmentVariable":
        if values[0] in env:
            return env[values[0]]
        return values[1] if len(values) > 1 else _Unset(values[0])
    try:
        if name == "bool":
            return values[0] if isinstance(values[0], bool) else str(values[0]).lower() == "true"
        if name == "int":
            return int(values[0])
        if name == "string":
            return _render(values[0], "json" if isinstance(values[0], (list, dict)) else "text")
        if name == "json":
            return json.loads(values[0])
    except (ValueError, TypeError) as exc:
        return _NotEvaluated(f"{name}() of a value it refuses ({exc})")
    return _NotEvaluated(f"a call of {name}()")


def _render(value: Any, how: Render) -> str:
    """The app setting's text, as the template's string()/join() writes it."""
    if how == "json" or (isinstance(value, (list, dict)) and how == "text"):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"  # else a wrong type: the app's check names it
    if how == "positive":  # main.bicep's `relayReadyPort > 0`
        return "true" if isinstance(value, int) and value > 0 else "false"
    if how == "csv":
        return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
    return "" if value is None else str(value)
