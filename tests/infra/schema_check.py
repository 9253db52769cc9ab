"""Check every resource body of infra/ against Azure's published types, offline.

The types are bicep-types-az's (the ones Bicep type-checks against, generated from the
Azure REST API specs), kept as a small extract in tests/infra/schemas/azure-types.json
(`extract.py` beside it regenerates it; source and licence in its README).

What is checked, per resource: its `Type@api-version` exists and is deployable at the
scope it is declared at; every property name exists at its place (casing and nesting
included) and is not read-only; required properties are present; every value that can be
evaluated offline matches its type (string/int/bool/object/array, enum literals, integer
bounds, string length and pattern). Values are evaluated from literals, variables,
parameters (the value a module call passes, else the default; every `@allowed` value and
the worked example's values too), module outputs, interpolation, both arms of a ternary
and the Bicep functions below. What cannot be evaluated (a resource's runtime property,
`uniqueString`, a secure parameter...) is *not checked* and counted as such; a value known
only to be a string is checked against a plain string type and counted as not checked
where the type constrains more (enum, pattern, length).
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pycep import BicepParser
from pycep.models import BicepElement

from tests.infra.bicep import INFRA, Template, bicep_files, parse, parse_bicepparam

SCHEMAS = Path(__file__).resolve().parent / "schemas"

# ResourceType scope flags (bicep-types: ScopeType).
SCOPE_RESOURCE_GROUP = 8
SCOPE_EXTENSION = 16
# ObjectTypeProperty flags (bicep-types: ObjectTypePropertyFlags).
REQUIRED, READ_ONLY = 1, 2

# Keys of a resource declaration that are Bicep's, not the resource body's.
BICEP_KEYS = {"parent", "scope", "dependsOn", "depends_on"}

MAX_ALTERNATIVES = 64


@dataclass(frozen=True)
class Unknown:
    """A value that cannot be evaluated offline; `kind` is its type where it is known."""

    kind: str | None = None
    why: str = ""


@dataclass(frozen=True)
class Ref:
    """A resource or module symbol (its properties are mostly runtime values)."""

    template: Path
    symbol: str
    kind: str  # "resource" | "module"


@dataclass
class Loop:
    """`[for x in ...: item]` whose iterable is unknown: one representative item."""

    item: Any


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    resources: int = 0
    # Places (resource + path) whose property name / value was checked, each once.
    property_places: set[str] = field(default_factory=set)
    value_places: set[str] = field(default_factory=set)
    not_checked: Counter = field(default_factory=Counter)
    not_checked_where: list[str] = field(default_factory=list)

    def unchecked(self, where: str, why: str) -> None:
        # Once per place, however many alternatives reach it.
        entry = f"{where} ({why})"
        if entry not in self.not_checked_where:
            self.not_checked[why] += 1
            self.not_checked_where.append(entry)

    def summary(self) -> str:
        total = sum(self.not_checked.values())
        reasons = ", ".join(f"{n} {why}" for why, n in self.not_checked.most_common())
        return (
            f"{self.resources} resource bodies, {len(self.property_places)} property names and "
            f"{len(self.value_places)} values checked against Azure's types; "
            f"{total} values not checked ({reasons})"
        )


@cache
def schema() -> dict[str, Any]:
    return json.loads((SCHEMAS / "azure-types.json").read_text())


def type_at(ref: dict[str, str] | str) -> dict[str, Any]:
    text = ref["$ref"] if isinstance(ref, dict) else ref
    return schema()["types"][int(text[2:])]


# ---------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------

_parser = BicepParser()
_INTERPOLATION = re.compile(r"\$\{((?:[^{}']|'[^']*')*)\}")


@cache
def _expression(text: str) -> Any:
    return _parser.parse(text=f"var x = {text}\n")["variables"]["x"]["value"]


def _kind(value: Any) -> str | None:
    if isinstance(value, Unknown):
        return value.kind
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (dict, Ref)):
        return "object"
    if isinstance(value, (list, Loop)):
        return "array"
    return None


def alternatives(value: Any) -> list[Any]:
    return value.options if isinstance(value, Alt) else [value]


@dataclass
class Alt:
    """One of several values (a ternary's arms, a parameter's allowed values)."""

    options: list[Any]

    @staticmethod
    def of(options: list[Any]) -> Any:
        flat: list[Any] = []
        for option in options:
            for o in alternatives(option):
                if not any(type(o) is type(f) and o == f for f in flat):
                    flat.append(o)
        if len(flat) == 1:
            return flat[0]
        if len(flat) > MAX_ALTERNATIVES:
            return Unknown(None, "too many alternatives")
        return Alt(flat)


# Functions whose result is a string (or other kind) we cannot compute offline.
_STRING_FUNCTIONS = {
    "unique_string",
    "guid",
    "resource_id",
    "subscription_resource_id",
    "tenant_resource_id",
    "extension_resource_id",
    "load_text_content",
    "load_file_as_base64",
    "base64",
    "format",
    "uri",
    "substring",
}
_OBJECT_FUNCTIONS = {"resource_group", "subscription", "tenant", "environment", "deployment"}


class Evaluator:
    """Evaluates expressions of one template; params bound by `bindings` (name -> value)."""

    def __init__(self, template: Template, bindings: dict[str, Any]) -> None:
        self.template = template
        self.bindings = bindings
        self._vars: dict[str, Any] = {}

    def eval(self, node: Any, scope: dict[str, Any] | None = None) -> Any:
        scope = scope or {}
        if isinstance(node, BicepElement):
            return self.identifier(str(node), scope)
        if isinstance(node, (bool, int)) or node is None:
            return node
        if isinstance(node, str):
            return self.interpolate(node, scope)
        if isinstance(node, list):
            return [self.eval(item, scope) for item in node]
        if isinstance(node, dict):
            if "loop_type" in node:
                return self.loop(node, scope)
            if "function" in node and set(node) <= {"function", "decorators"}:
                return self.function(node["function"], scope)
            if set(node) == {"operator"}:
                return self.operator(node["operator"], scope)
            return {_key(key): self.eval(value, scope) for key, value in node.items()}
        return Unknown(None, "unsupported expression")

    def identifier(self, name: str, scope: dict[str, Any]) -> Any:
        if name in scope:
            return scope[name]
        if name in self.bindings:
            return self.bindings[name]
        tree = self.template.tree
        if name in tree.get("variables", {}):
            if name not in self._vars:
                self._vars[name] = Unknown(None, "recursive variable")
                self._vars[name] = self.eval(tree["variables"][name]["value"])
            return self._vars[name]
        if name in tree.get("resources", {}):
            return Ref(self.template.path, name, "resource")
        if name in tree.get("modules", {}):
            return Ref(self.template.path, name, "module")
        return Unknown(None, f"unbound {name}")

    def interpolate(self, text: str, scope: dict[str, Any]) -> Any:
        if "${" not in text:
            return text.replace("\\'", "'").replace("\\\\", "\\")
        parts: list[list[Any]] = []
        last = 0
        for m in _INTERPOLATION.finditer(text):
            parts.append([text[last : m.start()]])
            try:
                value = self.eval(_expression(m.group(1)), scope)
            except Exception:  # pycep cannot parse every expression
                value = Unknown("string", "interpolation")
            parts.append(alternatives(value))
            last = m.end()
        parts.append([text[last:]])
        results = []
        for combo in itertools.islice(itertools.product(*parts), MAX_ALTERNATIVES + 1):
            if any(not isinstance(p, (str, int)) or isinstance(p, bool) for p in combo):
                return Unknown("string", "interpolation of a runtime value")
            results.append("".join(str(p) for p in combo))
        return Alt.of(results)

    def loop(self, node: dict[str, Any], scope: dict[str, Any]) -> Any:
        detail = node["loop_type"]["detail"]
        iterable = self.eval(detail.get("array_name", detail.get("range")), scope)
        item_name = detail.get("item_name")
        body = node["config"]
        options = alternatives(iterable)
        if all(isinstance(o, list) for o in options):
            return Alt.of(
                [[self.eval(body, {**scope, item_name: item}) for item in o] for o in options]
            )
        return Loop(self.eval(body, {**scope, item_name: Unknown(None, "loop item")}))

    def access(self, base: Any, key: Any) -> Any:
        if isinstance(base, Alt):
            return Alt.of([self.access(b, key) for b in base.options])
        if isinstance(base, dict) and isinstance(key, str):
            if key in base:
                return base[key]
            return Unknown(None, f"no property {key}")
        if isinstance(base, list) and isinstance(key, int) and 0 <= key < len(base):
            return base[key]
        if isinstance(base, Ref):
            kind = "string" if key in _STRING_PROPERTIES else None
            return Unknown(kind, "resource property")
        if isinstance(base, Unknown):
            kind = "string" if key in _STRING_PROPERTIES else None
            return Unknown(kind, base.why or "runtime value")
        return Unknown(None, "cannot access")

    def accessor_chain(self, op: dict[str, Any], scope: dict[str, Any]) -> Any:
        # pycep nests `a.b.c` as (a, (b, c)): flatten to a, [b, c].
        keys: list[Any] = []
        node: Any = {"operator": op}
        first = None
        while True:
            inner = node.get("operator") if isinstance(node, dict) else None
            if inner and inner.get("type") == "property_accessor":
                left, right = inner["operands"]["operand_1"], inner["operands"]["operand_2"]
                if first is None:
                    first = left
                else:
                    keys.append(str(left))
                node = right
                continue
            keys.append(str(node) if not isinstance(node, dict) else node)
            break
        base = self.eval(first, scope)
        if isinstance(base, Ref) and base.kind == "module" and keys[:1] == ["outputs"]:
            base = self.module_output(base, keys[1])
            keys = keys[2:]
        elif isinstance(base, Ref) and keys[:1] == ["name"]:
            base = self.resource_name(base)
            keys = keys[1:]
        for key in keys:
            if isinstance(key, dict):
                return Unknown(None, "computed accessor")
            base = self.access(base, key)
        return base

    def resource_name(self, ref: Ref) -> Any:
        res = self.template.tree["resources"][ref.symbol]["config"]
        while "config" in res and ("loop_type" in res or "condition" in res):
            if "loop_type" in res:
                return Unknown("string", "name of a resource in a loop")
            res = res["config"]
        return self.eval(res.get("name"))

    def module_output(self, ref: Ref, output: str) -> Any:
        callee = module_evaluator(self.template.path, ref.symbol)
        if callee is None:
            return Unknown(None, "module output")
        outputs = callee.template.outputs
        if output not in outputs:
            return Unknown(None, f"no output {output}")
        value = callee.eval(outputs[output]["value"])
        declared = {"string": "string", "int": "int", "bool": "bool", "array": "array"}
        kind = declared.get(outputs[output].get("type"))
        if isinstance(value, Unknown) and value.kind is None and kind:
            # Bicep checks a module output against its declared type.
            return Unknown(kind, value.why)
        return value

    def function(self, func: dict[str, Any], scope: dict[str, Any]) -> Any:
        name = func["type"]
        params = func.get("parameters") or {}
        args = {k: self.eval(v, scope) for k, v in params.items() if v is not None}
        if name in _STRING_FUNCTIONS:
            return Unknown("string", name)
        if name in _OBJECT_FUNCTIONS:
            return Unknown("object", f"{name}()")
        try:
            return self._concrete(name, args)
        except _NotConcrete as exc:
            kind = exc.kind
            if name == "take" and all(
                _kind(o) == "string" for o in alternatives(args.get("original_value"))
            ):
                kind = "string"
            return Unknown(kind, name)

    def _concrete(self, name: str, args: dict[str, Any]) -> Any:
        def each(*keys: str, deep: bool = False) -> list[tuple[Any, ...]]:
            lists = [alternatives(args[k]) for k in keys if k in args]
            combos = list(itertools.islice(itertools.product(*lists), MAX_ALTERNATIVES + 1))
            for combo in combos:
                for v in combo:
                    if isinstance(v, (Unknown, Ref, Loop)) or (deep and _has_unknown(v)):
                        raise _NotConcrete(_RESULT_KIND.get(name))
            return combos

        if name == "string":
            return Alt.of([_to_string(v) for (v,) in each("value_to_convert", deep=True)])
        if name == "empty":
            return Alt.of([len(v) == 0 for (v,) in each("item_to_test")])
        if name == "to_lower":
            return Alt.of([v.lower() for (v,) in each("string_to_change")])
        if name == "take":
            return Alt.of([v[:n] for v, n in each("original_value", "number_to_take")])
        if name == "replace":
            keys = ("original_string", "old_string", "new_string")
            return Alt.of([a.replace(b, c) for a, b, c in each(*keys)])
        if name == "contains":
            return Alt.of([b in a for a, b in each("container", "item_to_find")])
        if name in ("union", "concat"):
            keys = sorted(args, key=lambda k: int(k.split("_")[1]))
            if _product_size([args[k] for k in keys]) > MAX_ALTERNATIVES:
                return _merged_union([args[k] for k in keys])
            results = []
            for combo in each(*keys):
                if all(isinstance(v, dict) for v in combo):
                    merged: dict[str, Any] = {}
                    for v in combo:
                        merged.update(v)
                    results.append(merged)
                elif all(isinstance(v, list) for v in combo):
                    results.append([x for v in combo for x in v])
                elif all(isinstance(v, str) for v in combo):
                    results.append("".join(combo))
                else:
                    raise _NotConcrete(None)
            return Alt.of(results)
        if name == "items":
            return Alt.of(
                [[{"key": k, "value": v[k]} for k in sorted(v)] for (v,) in each("arg_1")]
            )
        raise _NotConcrete(_RESULT_KIND.get(name))

    def operator(self, op: dict[str, Any], scope: dict[str, Any]) -> Any:
        op = _reassociate(op)
        kind = op["type"]
        operands = op.get("operands", {})
        if kind == "property_accessor":
            return self.accessor_chain(op, scope)
        if kind == "index_accessor":
            base = self.eval(operands["operand_1"], scope)
            key = self.eval(operands["operand_2"], scope)
            if isinstance(key, (str, int)) and not isinstance(key, bool):
                return self.access(base, key)
            return Unknown(None, "computed index")
        if kind == "conditional":
            cond = self.eval(operands["condition"], scope)
            yes = lambda: self.eval(operands["true_value"], scope)  # noqa: E731
            no = lambda: self.eval(operands["false_value"], scope)  # noqa: E731
            if cond is True:
                return yes()
            if cond is False:
                return no()
            return Alt.of([yes(), no()])
        values = {k: self.eval(v, scope) for k, v in operands.items()}
        try:
            return _logic(kind, values)
        except _NotConcrete:
            return Unknown("bool" if kind in _BOOL_OPS else None, kind)


# Properties ARM always returns as strings (resourceGroup().location, x.id, ...).
_STRING_PROPERTIES = {
    "id",
    "name",
    "location",
    "tenantId",
    "subscriptionId",
    "principalId",
    "clientId",
}
_BOOL_OPS = {"not", "and", "or", "equals", "not_equals", "greater_than", "less_than"}
_RESULT_KIND = {
    "string": "string",
    "to_lower": "string",
    "take": None,
    "replace": "string",
    "empty": "bool",
    "contains": "bool",
    "union": None,
    "concat": None,
    "items": "array",
}


def _product_size(values: list[Any]) -> int:
    size = 1
    for v in values:
        size *= len(alternatives(v))
    return size


def _merged_union(values: list[Any]) -> Any:
    """union() of objects with too many combinations: one object holding every key any
    combination can hold, each with all its possible values (every item that can be
    deployed is in it, so checking it checks them all)."""
    merged: dict[str, list[Any]] = {}
    for value in values:
        for option in alternatives(value):
            if not isinstance(option, dict):
                raise _NotConcrete(None)
            for key, item in option.items():
                merged.setdefault(key, []).append(item)
    return {key: Alt.of(items) for key, items in merged.items()}


def _reassociate(op: dict[str, Any]) -> dict[str, Any]:
    """pycep parses `a == b ? x : y` as `a == (b ? x : y)` (and `!a ? x : y` as
    `!(a ? x : y)`); in Bicep the ternary binds loosest: `(a == b) ? x : y`."""
    if op["type"] in ("property_accessor", "index_accessor", "conditional"):
        return op
    operands = op.get("operands", {})
    if not operands:
        return op
    last_key = list(operands)[-1]
    last = operands[last_key]
    inner = last.get("operator") if isinstance(last, dict) else None
    if not inner or inner.get("type") != "conditional":
        return op
    cond = inner["operands"]
    head = {"operator": {**op, "operands": {**operands, last_key: cond["condition"]}}}
    return {
        "type": "conditional",
        "operands": {
            "condition": head,
            "true_value": cond["true_value"],
            "false_value": cond["false_value"],
        },
    }


class _NotConcrete(Exception):
    def __init__(self, kind: str | None) -> None:
        super().__init__(kind)
        self.kind = kind


def _key(key: str) -> str:
    """An object key as Azure sees it: `'odata.type'` is written quoted in Bicep."""
    return key[1:-1] if len(key) > 1 and key[0] == key[-1] == "'" else key


def _has_unknown(value: Any) -> bool:
    if isinstance(value, (Unknown, Ref, Loop, Alt)):
        return True
    if isinstance(value, dict):
        return any(_has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_unknown(v) for v in value)
    return False


def _to_string(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


_ARITHMETIC = {
    "less_than": lambda a, b: a < b,
    "less_than_or_equals": lambda a, b: a <= b,
    "greater_than": lambda a, b: a > b,
    "greater_than_or_equals": lambda a, b: a >= b,
    "add": lambda a, b: a + b,
    "substract": lambda a, b: a - b,
    "minus": lambda a: -a,
    "multiply": lambda a, b: a * b,
    # ARM's div and mod truncate toward zero.
    "divide": lambda a, b: int(a / b),
    "modulo": lambda a, b: a - b * int(a / b),
}


def _logic(kind: str, values: dict[str, Any]) -> Any:
    lists = [alternatives(v) for v in values.values()]
    results = []
    for combo in itertools.islice(itertools.product(*lists), MAX_ALTERNATIVES + 1):
        if any(isinstance(v, (Unknown, Ref, Loop)) for v in combo):
            raise _NotConcrete("bool")
        if kind == "not":
            results.append(not combo[0])
        elif kind == "and":
            results.append(all(combo))
        elif kind == "or":
            results.append(any(combo))
        elif kind == "equals":
            results.append(combo[0] == combo[1])
        elif kind == "not_equals":
            results.append(combo[0] != combo[1])
        elif kind in _ARITHMETIC and all(
            isinstance(v, int) and not isinstance(v, bool) for v in combo
        ):
            results.append(_ARITHMETIC[kind](*combo))
        else:
            raise _NotConcrete(None)
    return Alt.of(results)


# ---------------------------------------------------------------------------------------
# Parameter bindings: what each template's parameters can be in a deployment of main.bicep
# ---------------------------------------------------------------------------------------


def _param_candidates(template: Template, name: str, given: list[Any]) -> Any:
    param = template.params[name]
    options = list(given)
    allowed = template.decorator(name, "allowed")
    if allowed:
        options.extend(allowed)
    return Alt.of(options) if options else Unknown(param.get("type"), "parameter")


@cache
def main_evaluator() -> Evaluator:
    main = Template.load(INFRA / "main.bicep")
    example = parse_bicepparam(INFRA / "main.bicepparam")
    bindings: dict[str, Any] = {}
    for name, param in main.params.items():
        given: list[Any] = []
        if param.get("default") is not None:
            given.append(param["default"])
        if name in example and not _is_expression(example[name]):
            given.append(example[name])
        if main.decorator(name, "secure"):
            bindings[name] = Unknown(param.get("type"), "secure parameter")
            continue
        bindings[name] = _param_candidates(main, name, given)
    # Defaults that are expressions (resourceGroup().location) evaluate in main itself.
    evaluator = Evaluator(main, {})
    for name in main.params:
        if isinstance(bindings[name], Alt) or not isinstance(bindings[name], Unknown):
            values = [
                evaluator.eval(v) if isinstance(v, (dict, BicepElement)) else v
                for v in alternatives(bindings[name])
            ]
            bindings[name] = Alt.of(values)
    return Evaluator(main, bindings)


def _is_expression(value: Any) -> bool:
    return isinstance(value, (dict, BicepElement))


@cache
def module_evaluator(caller: Path, symbol: str) -> Evaluator | None:
    """The evaluator of a module as `caller` calls it (only main.bicep calls modules)."""
    if caller != INFRA / "main.bicep":
        return None
    outer = main_evaluator()
    module = outer.template.modules[symbol]
    config = module["config"]
    if "condition" in config and "config" in config:
        config = config["config"]
    path = (caller.parent / module["detail"]["path"]).resolve()
    inner = Template.load(path)
    bindings: dict[str, Any] = {}
    for name, param in inner.params.items():
        if name in config.get("params", {}):
            value = outer.eval(config["params"][name])
            if isinstance(value, Unknown) and inner.decorator(name, "allowed"):
                value = _param_candidates(inner, name, [])
            bindings[name] = value
        elif param.get("default") is not None:
            default = param["default"]
            bindings[name] = (
                Evaluator(inner, {}).eval(default) if _is_expression(default) else default
            )
        else:
            bindings[name] = Unknown(param.get("type"), "parameter without value")
    return Evaluator(inner, bindings)


def evaluator_for(path: Path) -> Evaluator:
    if path == INFRA / "main.bicep":
        return main_evaluator()
    main = Template.load(INFRA / "main.bicep")
    for symbol, module in main.modules.items():
        if (INFRA / module["detail"]["path"]).resolve() == path:
            found = module_evaluator(INFRA / "main.bicep", symbol)
            if found is not None:
                return found
    # A module main does not call directly: its defaults and allowed values.
    template = Template.load(path)
    bindings = {}
    for name, param in template.params.items():
        given = [param["default"]] if param.get("default") is not None else []
        given = [g for g in given if not _is_expression(g)]
        bindings[name] = _param_candidates(template, name, given)
    return Evaluator(template, bindings)


# ---------------------------------------------------------------------------------------
# Type checking
# ---------------------------------------------------------------------------------------


def resource_types(type_: str, api_version: str) -> list[dict[str, Any]]:
    refs = schema()["resources"].get(f"{type_}@{api_version}", [])
    if not refs:
        # Resource types are case-insensitive in ARM.
        for key, found in schema()["resources"].items():
            if key.lower() == f"{type_}@{api_version}".lower():
                refs = found
    return [type_at(f"#/{i}") for i in refs]


class Checker:
    def __init__(self, report: Report) -> None:
        self.report = report

    def check_value(self, value: Any, ref: Any, where: str) -> None:
        t = type_at(ref)
        kind = t["$type"]
        if isinstance(value, Alt):
            for option in value.options:
                self.check_value(option, ref, where)
            return
        if kind == "AnyType":
            self.report.value_places.add(where)
            return
        if isinstance(value, Unknown):
            self._check_unknown(value, t, where)
            return
        if isinstance(value, Ref):
            self.report.unchecked(where, "resource reference")
            return
        if kind == "UnionType":
            self._check_union(value, t, where)
            return
        if kind == "StringLiteralType":
            self.report.value_places.add(where)
            if value != t["value"]:
                self.error(where, f"{value!r} is not {t['value']!r}")
            return
        if kind == "StringType":
            self.report.value_places.add(where)
            if not isinstance(value, str):
                self.error(where, f"expects a string, got {value!r}")
                return
            if len(value) < t.get("minLength", 0) or len(value) > t.get("maxLength", 1 << 30):
                self.error(where, f"{value!r}: length outside {t}")
            if "pattern" in t and not re.search(t["pattern"], value):
                self.error(where, f"{value!r} does not match {t['pattern']}")
            return
        if kind == "IntegerType":
            self.report.value_places.add(where)
            if not isinstance(value, int) or isinstance(value, bool):
                self.error(where, f"expects an integer, got {value!r}")
                return
            if value < t.get("minValue", -(1 << 63)) or value > t.get("maxValue", 1 << 63):
                self.error(where, f"{value} outside {t.get('minValue')}..{t.get('maxValue')}")
            return
        if kind == "BooleanType":
            self.report.value_places.add(where)
            if not isinstance(value, bool):
                self.error(where, f"expects a bool, got {value!r}")
            return
        if kind == "ArrayType":
            if isinstance(value, Loop):
                self.check_value(value.item, t["itemType"], f"{where}[*]")
                return
            if not isinstance(value, list):
                self.report.value_places.add(where)
                self.error(where, f"expects an array, got {value!r}")
                return
            self.report.value_places.add(where)
            if len(value) < t.get("minLength", 0) or len(value) > t.get("maxLength", 1 << 30):
                self.error(where, f"{len(value)} items, outside {t}")
            for i, item in enumerate(value):
                self.check_value(item, t["itemType"], f"{where}[{i}]")
            return
        if kind in ("ObjectType", "DiscriminatedObjectType"):
            if not isinstance(value, dict):
                self.report.value_places.add(where)
                self.error(where, f"expects an object, got {value!r}")
                return
            self.check_object(value, t, where)
            return
        if kind == "NullType":
            self.report.value_places.add(where)
            if value is not None:
                self.error(where, f"expects null, got {value!r}")
            return
        self.report.unchecked(where, f"schema type {kind}")

    def _check_unknown(self, value: Unknown, t: dict[str, Any], where: str) -> None:
        # A value known to be a string is checked against a plain string type.
        constrained = {"pattern", "minLength", "maxLength"} & set(t)
        if value.kind == "string" and t["$type"] == "StringType" and not constrained:
            self.report.value_places.add(where)
            return
        if value.kind == "string" and t["$type"] == "UnionType":
            members = [type_at(e) for e in t["elements"]]
            if any(m["$type"] == "StringType" and len(m) == 1 for m in members):
                self.report.value_places.add(where)
                return
        expected = {
            "StringType": "string",
            "IntegerType": "int",
            "BooleanType": "bool",
            "ArrayType": "array",
        }.get(t["$type"])
        if value.kind and expected and value.kind != expected and value.kind != "object":
            self.error(where, f"expects {expected}, got a {value.kind} expression")
            return
        self.report.unchecked(where, value.why or "expression")

    def _check_union(self, value: Any, t: dict[str, Any], where: str) -> None:
        members = [e for e in t["elements"]]
        for member in members:
            probe = Checker(Report())
            probe.check_value(value, member, where)
            if not probe.report.errors:
                self.report.value_places.add(where)
                self.report.property_places |= probe.report.property_places
                return
        literals = [type_at(m).get("value") for m in members if "value" in type_at(m)]
        self.report.value_places.add(where)
        self.error(where, f"{value!r} is none of {literals or 'the allowed types'}")

    def check_object(self, value: dict[str, Any], t: dict[str, Any], where: str) -> None:
        props = dict(t.get("properties") or t.get("baseProperties") or {})
        if t["$type"] == "DiscriminatedObjectType":
            disc = t["discriminator"]
            chosen = value.get(disc)
            elements = {k.lower(): v for k, v in t["elements"].items()}
            if isinstance(chosen, str) and chosen.lower() in elements:
                props.update(type_at(elements[chosen.lower()]).get("properties", {}))
            elif isinstance(chosen, str):
                self.report.value_places.add(where)
                self.error(where, f"{disc} {chosen!r} is none of {sorted(t['elements'])}")
                return
            else:
                self.report.unchecked(f"{where}.{disc}", "discriminator not evaluated")
                # The properties of every variant are possible.
                for element in t["elements"].values():
                    props.update(type_at(element).get("properties", {}))
        extra = t.get("additionalProperties")
        for key, item in value.items():
            at = f"{where}.{key}" if where else key
            if key in props:
                self.report.property_places.add(at)
                prop = props[key]
                if prop.get("flags", 0) & READ_ONLY and not prop.get("flags", 0) & REQUIRED:
                    self.error(at, "is read-only")
                    continue
                if not prop.get("flags", 0) & REQUIRED and None in alternatives(item):
                    self.report.value_places.add(at)  # null: the property is left out
                    rest = [o for o in alternatives(item) if o is not None]
                    if not rest:
                        continue
                    item = Alt.of(rest)
                self.check_value(item, prop["type"], at)
                continue
            wrong_case = [p for p in props if p.lower() == key.lower()]
            if wrong_case:
                self.report.property_places.add(at)
                self.error(at, f"is spelled {wrong_case[0]!r} in the schema")
            elif extra is not None:
                self.report.property_places.add(at)
                self.check_value(item, extra, at)
            else:
                self.report.property_places.add(at)
                self.error(at, f"is not a property here (known: {sorted(props)})")
        for key, prop in props.items():
            flags = prop.get("flags", 0)
            if flags & REQUIRED and not flags & READ_ONLY and key not in value:
                self.error(f"{where}.{key}" if where else key, "is required")

    def error(self, where: str, message: str) -> None:
        self.report.errors.append(f"{where}: {message}")


def _body_and_wrappers(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    loop = None
    while (
        isinstance(config, dict)
        and "config" in config
        and ("loop_type" in config or "condition" in config)
    ):
        if "loop_type" in config:
            loop = config
        config = config["config"]
    return config, loop


def check_resource(path: Path, symbol: str, report: Report) -> None:
    evaluator = evaluator_for(path)
    res = evaluator.template.tree["resources"][symbol]
    shown = path.relative_to(INFRA).as_posix() if path.is_relative_to(INFRA) else path.name
    where = f"{shown}:{symbol}"
    type_, version = res["type"], res["api_version"]
    candidates = resource_types(type_, version)
    checker = Checker(report)
    report.resources += 1
    if not candidates:
        checker.error(where, f"{type_}@{version} is not a published resource type/api-version")
        return
    raw, loop = _body_and_wrappers(res["config"])
    scopes: list[dict[str, Any]] = [{}]
    if loop is not None:
        detail = loop["loop_type"]["detail"]
        item = detail.get("item_name") or "i"
        iterable = evaluator.eval(detail.get("array_name"))
        if isinstance(iterable, list) and iterable:
            scopes = [{item: value} for value in iterable]
        else:
            scopes = [{item: Unknown(None, "loop item")}]
        if detail.get("index_name"):
            for s in scopes:
                s[detail["index_name"]] = Unknown("int", "loop index")
    for n, scope in enumerate(scopes):
        body = {k: evaluator.eval(v, scope) for k, v in raw.items() if k not in BICEP_KEYS}
        at = f"{where}[{n}]" if len(scopes) > 1 else where
        _check_body(res, raw, body, candidates, at, report, counted=n == 0)


def _check_body(
    res: dict[str, Any],
    raw: dict[str, Any],
    body: dict[str, Any],
    candidates: list[dict[str, Any]],
    where: str,
    report: Report,
    counted: bool,
) -> None:
    type_, version = res["type"], res["api_version"]
    checker = Checker(report)
    if not counted:
        report.resources += 1
    # Pick the resource type whose name matches (sites/config: authsettingsV2, ...).
    rtype = candidates[0]
    if len(candidates) > 1:
        name = body.get("name")
        for c in candidates:
            name_type = type_at(c["body"]).get("properties", {}).get("name", {}).get("type")
            literal = type_at(name_type).get("value") if name_type else None
            if isinstance(name, str) and literal and literal.lower() == name.lower():
                rtype = c
    writable = rtype.get("writableScopes", rtype.get("flags", 0))
    wanted = SCOPE_EXTENSION if "scope" in raw else SCOPE_RESOURCE_GROUP
    if not res["existing"] and not writable & wanted:
        checker.error(where, f"{type_}@{version} is not deployable at this scope ({writable})")
    if res["existing"]:
        return
    sub = Report()
    Checker(sub).check_value(body, rtype["body"], "")
    report.property_places |= {f"{where}:{p}" for p in sub.property_places}
    report.value_places |= {f"{where}:{p}" for p in sub.value_places}
    for why, n in sub.not_checked.items():
        report.not_checked[why] += n
    report.not_checked_where.extend(f"{where}: {w}" for w in sub.not_checked_where)
    report.errors.extend(f"{where}: {e}" for e in sub.errors)


def check_all() -> Report:
    report = Report()
    for path in bicep_files():
        tree = parse(path)
        for symbol in tree.get("resources", {}):
            check_resource(path, symbol, report)
    return report
