"""Logging: one JSON object per line (for journald and log shippers) or plain text for people.

Structured fields travel in `extra={"fields": {...}}` so the JSON form keeps them as keys.
`ErrorStreak` exists because a relay polling once a second must not write 86,400 identical
lines a day while IMDS or Service Bus is down: each kind of error is logged once per streak,
then one line when it recovers.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import datetime, timezone

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = logging.getLogger("relay")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, timezone.utc).strftime("%H:%M:%S")
        fields = getattr(record, "fields", None) or {}
        tail = " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{moment} {record.levelname:<7} {record.getMessage()}"
        if tail:
            line += f"  {tail}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(log_format: str = "json", level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def event(logger: logging.Logger, level: int, msg: str, **fields: Any) -> None:
    logger.log(level, msg, extra={"fields": fields})


class ErrorStreak:
    """Log each kind of error once per streak of failures, and one line on recovery."""

    def __init__(self, logger: logging.Logger, what: str, clock: Any = time.monotonic) -> None:
        self._log = logger
        self._what = what
        self._clock = clock
        self._kinds: set[str] = set()
        self._count = 0
        self._since = 0.0
        self.last_error: str | None = None

    @property
    def failing(self) -> bool:
        return self._count > 0

    @property
    def count(self) -> int:
        return self._count

    def error(self, kind: str, detail: str, level: int = logging.WARNING, **fields: Any) -> None:
        if self._count == 0:
            self._since = self._clock()
        self._count += 1
        self.last_error = kind
        if kind in self._kinds:
            return
        self._kinds.add(kind)
        event(
            self._log,
            level,
            f"{self._what} error: {detail}",
            kind=kind,
            errors_in_streak=self._count,
            note="logged once per streak; a recovery line follows",
            **fields,
        )

    def ok(self) -> None:
        if self._count:
            event(
                self._log,
                logging.INFO,
                f"{self._what} recovered",
                errors_in_streak=self._count,
                kinds=sorted(self._kinds),
                seconds=round(self._clock() - self._since, 1),
            )
        self._kinds.clear()
        self._count = 0
        self.last_error = None


def jitter(low: float, high: float) -> float:
    """A random factor for backoff. `random` is imported on the first error, not at start:
    a healthy relay never needs it (and every module not loaded is memory on every VM)."""
    import random

    return random.uniform(low, high)  # noqa: S311 - spreading retries, not security


def clip(exc: BaseException, limit: int = 200) -> str:
    """An exception's text, cut short: HTTP errors can carry whole URLs and reprs."""
    text = str(exc)
    return text if len(text) < limit else text[:limit] + "..."
