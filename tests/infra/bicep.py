"""Read the Bicep templates through pycep-parser's JSON tree.

There is no Bicep CLI offline, so the tests reason about the parsed source. pycep writes
a bare identifier and a string literal the same way (both as a str), so helpers here
resolve a str against the file's params, vars and resources only where the tests expect
a reference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pycep import BicepParser

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MODULES = INFRA / "modules"

# Built-in Azure role definitions the templates may use (name -> id). Each id checked (each
# role's JSON block: "name" and "roleName") against Microsoft's built-in roles reference,
# "Azure built-in roles for <category>", source MicrosoftDocs/azure-docs
# articles/role-based-access-control/built-in-roles/<category>.md, published as
# https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/<category>:
#   general.md     Reader
#   integration.md Azure Service Bus Data Sender, Azure Service Bus Data Receiver
#   storage.md     Storage Table Data Contributor, Storage Blob Data Owner,
#                  Storage Blob Data Contributor
#   security.md    Key Vault Secrets User
#   monitor.md     Monitoring Metrics Publisher
# (read through the stored copies of those pages and files, issue #22 review).
# Scheduled Events Contributor (Learn's "ScheduledEventContributor", the role the Scheduled
# Events Event Grid / Resource Graph pages give the Maintenance resource provider) is not in
# MicrosoftDocs/azure-docs built-in-roles/compute.md @ 064f7ba2 (Sep 2025) yet; its id is
# the one two public dumps of Azure's built-in role list give (GitHub code search, read for
# issue 32): b67fe603-310e-4889-b9ee-8257d09d353d. infra/README.md has the deployer confirm
# it with `az role definition list --name "Scheduled Events Contributor"` before enabling.
BUILTIN_ROLES = {
    "Reader": "acdd72a7-3385-48ef-bd42-f606fba81ae7",
    "Azure Service Bus Data Sender": "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39",
    "Azure Service Bus Data Receiver": "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0",
    "Storage Table Data Contributor": "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3",
    "Storage Blob Data Owner": "b7e6dc6d-f1e8-4753-8033-0f276bb0955b",
    "Storage Blob Data Contributor": "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    "Key Vault Secrets User": "4633458b-17de-408a-b874-0445c86b69e6",
    "Monitoring Metrics Publisher": "3913510d-42f4-4e42-8a64-420c390055eb",
    "Scheduled Events Contributor": "b67fe603-310e-4889-b9ee-8257d09d353d",
}
ROLE_NAMES = {v: k for k, v in BUILTIN_ROLES.items()}

_parser = BicepParser()


def bicep_files() -> list[Path]:
    return sorted(INFRA.rglob("*.bicep"))


@cache
def parse(path: Path) -> dict[str, Any]:
    return _parser.parse(file_path=path)


def parse_bicepparam(path: Path) -> dict[str, Any]:
    """A .bicepparam is `using '...'` plus `param NAME = VALUE` lines; pycep reads the
    assignments once they are phrased as variables."""
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith("using "):
            continue
        lines.append(re.sub(r"^param (\w+) =", r"var \1 =", line))
    tree = _parser.parse(text="\n".join(lines) + "\n")
    return {name: var["value"] for name, var in tree["variables"].items()}


@dataclass
class Resource:
    """One resource declaration, with its condition and loop (if any) lifted out."""

    symbol: str
    type: str
    existing: bool
    body: dict[str, Any]
    condition: Any = None
    loop: dict[str, Any] | None = None
    decorators: list[Any] = field(default_factory=list)


@dataclass
class Template:
    path: Path
    tree: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> Template:
        return cls(path, parse(path))

    @property
    def params(self) -> dict[str, Any]:
        return self.tree.get("parameters", {})

    @property
    def variables(self) -> dict[str, Any]:
        return {k: v["value"] for k, v in self.tree.get("variables", {}).items()}

    @property
    def outputs(self) -> dict[str, Any]:
        return self.tree.get("outputs", {})

    @property
    def modules(self) -> dict[str, Any]:
        return self.tree.get("modules", {})

    def resources(self, type_: str | None = None) -> list[Resource]:
        found = []
        for symbol, res in self.tree.get("resources", {}).items():
            config = res["config"]
            condition = None
            loop = None
            if "loop_type" in config:
                loop = config["loop_type"]
                condition = config.get("condition")
                config = config["config"]
            elif "condition" in config and "config" in config:
                condition = config["condition"]
                config = config["config"]
            if type_ is None or res["type"] == type_:
                found.append(
                    Resource(
                        symbol=symbol,
                        type=res["type"],
                        existing=res["existing"],
                        body=config,
                        condition=condition,
                        loop=loop,
                        decorators=res.get("decorators", []),
                    )
                )
        return found

    def resource(self, symbol: str) -> Resource:
        for res in self.resources():
            if res.symbol == symbol:
                return res
        raise KeyError(f"{self.path.name}: no resource {symbol!r}")

    def param_default(self, name: str) -> Any:
        return self.params[name]["default"]

    def decorator(self, param: str, kind: str) -> Any:
        for deco in self.params[param]["decorators"]:
            if deco["type"] == kind:
                return deco.get("argument", True)
        return None

    def expand(self, text: str) -> str:
        """Substitute `${var}` with string variables, repeatedly."""
        variables = self.variables
        for _ in range(10):
            new = re.sub(
                r"\$\{(\w+)\}",
                lambda m: (
                    variables[m.group(1)]
                    if isinstance(variables.get(m.group(1)), str)
                    else m.group(0)
                ),
                text,
            )
            if new == text:
                return new
            text = new
        return text


def load(name: str) -> Template:
    """`main` or a module's stem, e.g. `servicebus`."""
    path = INFRA / "main.bicep" if name == "main" else MODULES / f"{name}.bicep"
    return Template.load(path)


def module_path(template: Template, symbol: str) -> Path:
    return (template.path.parent / template.modules[symbol]["detail"]["path"]).resolve()


def module_params(template: Template, symbol: str) -> dict[str, Any]:
    config = template.modules[symbol]["config"]
    if "condition" in config and "config" in config:
        config = config["config"]
    return config["params"]


def role_definition_guid(template: Template, assignment: Resource) -> str:
    """The role GUID of `subscriptionResourceId('Microsoft.Authorization/roleDefinitions', X)`,
    or `symbol.name` for a custom role defined in the same template."""
    ref = assignment.body["properties"]["roleDefinitionId"]
    func = ref["function"]
    assert func["type"] == "subscription_resource_id", f"{assignment.symbol}: {ref}"
    assert func["parameters"]["resource_type"] == "Microsoft.Authorization/roleDefinitions"
    name = func["parameters"]["resource_name_1"]
    if not isinstance(name, str):
        return dotted(name)
    return template.variables.get(name, name)


def scope_symbol(assignment: Resource) -> str | None:
    """The resource a role assignment is scoped to: `x` or `x[i]`; None if unscoped."""
    scope = assignment.body.get("scope")
    if scope is None:
        return None
    if isinstance(scope, str):
        return scope
    op = scope.get("operator", {})
    if op.get("type") == "index_accessor":
        return op["operands"]["operand_1"]
    raise AssertionError(f"{assignment.symbol}: unexpected scope {scope}")


def dotted(node: Any) -> str:
    """`a.b.c` for a property-accessor chain (or a bare identifier)."""
    if isinstance(node, (str, int)):
        return str(node)
    op = node.get("operator", {}) if isinstance(node, dict) else {}
    if op.get("type") == "property_accessor":
        return f"{dotted(op['operands']['operand_1'])}.{dotted(op['operands']['operand_2'])}"
    if op.get("type") == "index_accessor":
        return f"{dotted(op['operands']['operand_1'])}[{dotted(op['operands']['operand_2'])}]"
    raise AssertionError(f"not an accessor chain: {node}")


def iso_minutes(duration: str) -> float:
    """Minutes in an ISO 8601 duration of the forms Azure uses here (PnD, PTnH, PTnM, PTnS)."""
    m = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?", duration)
    assert m and duration not in ("P", "PT"), f"not an ISO 8601 duration: {duration!r}"
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return days * 1440 + hours * 60 + minutes + seconds / 60
