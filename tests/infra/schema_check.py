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
The evaluation is tests/infra/bicep_evaluator.py's, over the values of
tests/infra/bicep_values.py; this module loads the types and checks the bodies.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from tests.infra.bicep import INFRA, bicep_files, parse
from tests.infra.bicep_evaluator import evaluator_for
from tests.infra.bicep_values import Alt, Loop, Ref, Unknown, alternatives

SCHEMAS = Path(__file__).resolve().parent / "schemas"

# ResourceType scope flags (bicep-types: ScopeType).
SCOPE_RESOURCE_GROUP = 8
SCOPE_EXTENSION = 16
# ObjectTypeProperty flags (bicep-types: ObjectTypePropertyFlags).
REQUIRED, READ_ONLY = 1, 2

# Keys of a resource declaration that are Bicep's, not the resource body's.
BICEP_KEYS = {"parent", "scope", "dependsOn", "depends_on"}


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
