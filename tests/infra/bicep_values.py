"""What a Bicep expression can be, offline, for tests/infra/schema_check.py: a value
(literal, object, array), one of several (`Alt`: a ternary's arms, a parameter's allowed
values), a value known only by its kind (`Unknown`: a runtime property, `uniqueString`...),
a resource or module symbol (`Ref`), or a loop's representative item (`Loop`); and the
operators and conversions computed on concrete values (`logic`, `to_string`, the union of
too many combinations). The evaluator that produces them is tests/infra/bicep_evaluator.py.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def value_kind(value: Any) -> str | None:
    """The Bicep type of `value` (string, int, bool, object, array); None if not known."""
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


def product_size(values: list[Any]) -> int:
    size = 1
    for v in values:
        size *= len(alternatives(v))
    return size


def merged_union(values: list[Any]) -> Any:
    """union() of objects with too many combinations: one object holding every key any
    combination can hold, each with all its possible values (every item that can be
    deployed is in it, so checking it checks them all)."""
    merged: dict[str, list[Any]] = {}
    for value in values:
        for option in alternatives(value):
            if not isinstance(option, dict):
                raise NotConcrete(None)
            for key, item in option.items():
                merged.setdefault(key, []).append(item)
    return {key: Alt.of(items) for key, items in merged.items()}


class NotConcrete(Exception):
    def __init__(self, kind: str | None) -> None:
        super().__init__(kind)
        self.kind = kind


def has_unknown(value: Any) -> bool:
    if isinstance(value, (Unknown, Ref, Loop, Alt)):
        return True
    if isinstance(value, dict):
        return any(has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(has_unknown(v) for v in value)
    return False


def to_string(value: Any) -> str:
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


def logic(kind: str, values: dict[str, Any]) -> Any:
    lists = [alternatives(v) for v in values.values()]
    results = []
    for combo in itertools.islice(itertools.product(*lists), MAX_ALTERNATIVES + 1):
        if any(isinstance(v, (Unknown, Ref, Loop)) for v in combo):
            raise NotConcrete("bool")
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
            raise NotConcrete(None)
    return Alt.of(results)
