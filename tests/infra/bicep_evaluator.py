"""Evaluate the expressions of infra/'s Bicep templates offline, for
tests/infra/schema_check.py (and the tests that read a template's values through it): an
`Evaluator` per template follows literals, variables, parameters, module outputs,
interpolation, both arms of a ternary and the Bicep functions it knows; the parameter
bindings below say what each template's parameters can be in a deployment of main.bicep
(what main passes, the defaults, every `@allowed` value, the worked example's values).
What the values can be is tests/infra/bicep_values.py.
"""

from __future__ import annotations

import itertools
import re
from functools import cache
from pathlib import Path
from typing import Any

from pycep import BicepParser
from pycep.models import BicepElement

from tests.infra.bicep import INFRA, Template, parse_bicepparam
from tests.infra.bicep_values import (
    MAX_ALTERNATIVES,
    Alt,
    Loop,
    NotConcrete,
    Ref,
    Unknown,
    alternatives,
    has_unknown,
    logic,
    merged_union,
    product_size,
    to_string,
    value_kind,
)

_parser = BicepParser()
_INTERPOLATION = re.compile(r"\$\{((?:[^{}']|'[^']*')*)\}")


@cache
def _expression(text: str) -> Any:
    return _parser.parse(text=f"var x = {text}\n")["variables"]["x"]["value"]


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
        except NotConcrete as exc:
            kind = exc.kind
            if name == "take" and all(
                value_kind(o) == "string" for o in alternatives(args.get("original_value"))
            ):
                kind = "string"
            return Unknown(kind, name)

    def _concrete(self, name: str, args: dict[str, Any]) -> Any:
        def each(*keys: str, deep: bool = False) -> list[tuple[Any, ...]]:
            lists = [alternatives(args[k]) for k in keys if k in args]
            combos = list(itertools.islice(itertools.product(*lists), MAX_ALTERNATIVES + 1))
            for combo in combos:
                for v in combo:
                    if isinstance(v, (Unknown, Ref, Loop)) or (deep and has_unknown(v)):
                        raise NotConcrete(_RESULT_KIND.get(name))
            return combos

        if name == "string":
            return Alt.of([to_string(v) for (v,) in each("value_to_convert", deep=True)])
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
            if product_size([args[k] for k in keys]) > MAX_ALTERNATIVES:
                return merged_union([args[k] for k in keys])
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
                    raise NotConcrete(None)
            return Alt.of(results)
        if name == "items":
            return Alt.of(
                [[{"key": k, "value": v[k]} for k in sorted(v)] for (v,) in each("arg_1")]
            )
        raise NotConcrete(_RESULT_KIND.get(name))

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
            return logic(kind, values)
        except NotConcrete:
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


def _key(key: str) -> str:
    """An object key as Azure sees it: `'odata.type'` is written quoted in Bicep."""
    return key[1:-1] if len(key) > 1 and key[0] == key[-1] == "'" else key


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
