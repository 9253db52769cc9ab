"""App-setting names as the pydantic settings models read them, and "did you mean".

A setting nobody reads is worse than a wrong value: `POLICY__DRYRUN=true` validates as
nothing at all and the app approves. So every name the app reads is derived from its
models (a field added to a model is a known name at once), and a name under one of the
app's prefixes that no model reads is an error naming the closest known one.

Standard library and pydantic only: the policy model and the settings check both use it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo

# How close (difflib ratio) a name must be to a known one to be called its typo.
CLOSE = 0.75


def did_you_mean(name: str, known: Iterable[str], cutoff: float = CLOSE) -> str | None:
    """The known name closest to `name` (compared case-insensitively), or None."""
    by_fold = {k.casefold(): k for k in known}
    found = difflib.get_close_matches(name.casefold(), list(by_fold), n=1, cutoff=cutoff)
    return by_fold[found[0]] if found else None


def suggestion(name: str, known: Iterable[str], cutoff: float = CLOSE) -> str:
    """ "; did you mean X?" or "" (for the end of an error message)."""
    close = did_you_mean(name, known, cutoff)
    return f"; did you mean {close}?" if close else ""


def _aliases(name: str, info: FieldInfo) -> list[str]:
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        # The first choice is the setting's name; the others are pydantic's field names
        # (populate_by_name) that nobody writes as an app setting.
        first = alias.choices[0]
        return [first] if isinstance(first, str) else [name]
    if isinstance(alias, str):
        return [alias]
    return [name]


def _nested(info: FieldInfo) -> type[BaseModel] | None:
    annotation = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def env_names(model: type[BaseModel]) -> set[str]:
    """Every environment name a pydantic-settings model reads (the models are
    case-insensitive; compare casefolded): `env_prefix` + field in upper case, or its alias
    as written (`ServiceBusConnection`), and for a nested model under
    `env_nested_delimiter` both the whole (`POLICY__PAGE`) and each field
    (`POLICY__PAGE__EVENT_TYPES`)."""
    config = model.model_config
    prefix = str(config.get("env_prefix") or "")
    delimiter = config.get("env_nested_delimiter")
    names: set[str] = set()
    for field, info in model.model_fields.items():
        for alias in _aliases(field, info):
            full = (prefix + alias).upper() if info.validation_alias is None else alias
            names.add(full)
            nested = _nested(info)
            if nested is not None and delimiter:
                names.update(f"{full}{delimiter}{sub}".upper() for sub in nested.model_fields)
    return names


def field_env_name(model: type[BaseModel], field: str) -> str:
    """The app setting that fills `field` of `model` (its first alias, or prefix + field)."""
    info = model.model_fields.get(field)
    if info is None:
        return field
    if info.validation_alias is not None:
        return _aliases(field, info)[0]
    return (str(model.model_config.get("env_prefix") or "") + field).upper()


def error_setting(model: type[BaseModel], loc: tuple) -> str:
    """Where a validation error is, as the app setting and the path inside its value:
    `DRAIN__ON_FAILURE`, `POLICY__RULES[2].match.sources`; "" for a whole-model error."""
    if not loc:
        return ""
    head = field_env_name(model, str(loc[0]))
    return head + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])


def error_message(error: Any) -> str:
    """pydantic's message for one error; for a choice among fixed values also what was given
    and the closest choice (only there: another input may be a secret)."""
    message = str(error["msg"]).removeprefix("Value error, ")
    given = error.get("input")
    if error["type"] in ("literal_error", "enum") and isinstance(given, str):
        expected = re.findall(r"'([^']*)'", str(error.get("ctx", {}).get("expected", "")))
        message += f", not {given[:64]!r}{suggestion(given, expected, cutoff=0.6)}"
    return message
