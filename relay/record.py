"""Small immutable records: the part of `dataclasses` the relay uses, without its imports.

`import dataclasses` loads inspect, ast, dis and tokenize: about 2.6 MB resident on every
VM for eight classes with plain fields. A record declares its fields as annotated class
attributes (a default makes a field optional; `Factory(dict)` gives each record its own);
it gets keyword/positional construction, `__post_init__`, equality and ordering over its
compared fields, a repr, `replace()`, and is frozen after construction.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_MISSING = object()


class _Factory:
    """A default made fresh for each record; `compare=False` leaves it out of equality."""

    def __init__(self, make: Callable[[], Any], compare: bool = True) -> None:
        self.make = make
        self.compare = compare


def Factory(make: Callable[[], Any], compare: bool = True) -> Any:
    """`field: dict[str, Any] = Factory(dict)`: typed as Any so that a checker takes it as
    the field's default (it is replaced by `make()` at construction)."""
    return _Factory(make, compare)


class Record:
    _fields: tuple[str, ...] = ()
    _compared: tuple[str, ...] = ()
    _defaults: dict[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names, compared, defaults = [], [], {}
        for klass in reversed(cls.__mro__):
            # The class's own annotations, as on 3.9 (no inspect.get_annotations there).
            for name in klass.__dict__.get("__annotations__", {}):  # noqa: RUF063
                if name.startswith("_") or name in names:
                    continue
                names.append(name)
                default = klass.__dict__.get(name, _MISSING)
                if default is not _MISSING:
                    defaults[name] = default
                if not (isinstance(default, _Factory) and not default.compare):
                    compared.append(name)
        cls._fields, cls._compared, cls._defaults = tuple(names), tuple(compared), defaults

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(self._fields):
            raise TypeError(f"{type(self).__name__}: too many arguments")
        values = dict(zip(self._fields, args))
        for name, value in kwargs.items():
            if name not in self._fields or name in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated {name!r}")
            values[name] = value
        for name in self._fields:
            if name not in values:
                if name not in self._defaults:
                    raise TypeError(f"{type(self).__name__}: missing {name!r}")
                default = self._defaults[name]
                values[name] = default.make() if isinstance(default, _Factory) else default
            object.__setattr__(self, name, values[name])
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._compared)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record) or type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Record) or type(other) is not type(self):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._compared)
        return f"{type(self).__name__}({shown})"

    def replace(self, **changes: Any) -> Any:
        values = {name: getattr(self, name) for name in self._fields}
        values.update(changes)
        return type(self)(**values)
