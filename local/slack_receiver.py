"""A local Slack incoming webhook: answers the way hooks.slack.com does.

Slack's incoming webhooks answer in plain text, not JSON: 200 `ok`; 400 `invalid_payload`
(not JSON, or blocks Slack refuses) or `no_text` (neither text nor blocks); 404
`no_service` (the webhook URL is unknown or was revoked); 429 with `Retry-After` when
rate limited (about one message a second per webhook). See Slack's "Sending messages
using incoming webhooks" (its "Handling errors" table) and the Block Kit reference for the
limits checked here. Tests check the bridge's messages with the official SDK as well
(slack_sdk's block models); this receiver holds the demo to the same rules with the
standard library only.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from local.receivers import Received, Receiver, _Fault

MAX_BLOCKS = 50
TEXT_TYPES = ("plain_text", "mrkdwn")


class SlackReceiver(Receiver):
    """One Slack incoming webhook at `/services/T…/B…/<token>`; any other path is 404
    `no_service`, as for a revoked webhook."""

    channel = "slack"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        on_receive: Callable[[Received], None] | None = None,
    ) -> None:
        super().__init__(host, port, on_receive)
        self.path = f"/services/TLOCAL0001/BLOCAL0001/{secrets.token_urlsafe(18)}"
        self._pace_lock = threading.Lock()
        self._interval: float | None = None  # enforce_rate: least seconds between posts
        self._retry_after = 1
        self._last: float | None = None

    def enforce_rate(self, interval: float = 1.0, retry_after: int = 1) -> None:
        """Answer 429 `rate_limited` with Retry-After, as Slack does past "1 per second",
        to a post that comes less than `interval` seconds after the one before it."""
        self._interval, self._retry_after = interval, retry_after

    def rate_limit_next(self, count: int, retry_after: int = 1) -> None:
        """Answer the next `count` posts 429 `rate_limited` with Retry-After, as Slack does."""
        self.fail_next(count, 429, {"Retry-After": str(retry_after)})

    def check(self, path: str, headers: dict[str, str], body: Any, raw: bytes) -> list[str]:
        if path != self.path:
            return ["no_service"]
        if not isinstance(body, dict):
            return ["invalid_payload: the body is not a JSON object"]
        blocks = body.get("blocks")
        text = body.get("text")
        if not blocks and not (isinstance(text, str) and text.strip()):
            return ["no_text"]
        problems: list[str] = []
        if text is not None and not isinstance(text, str):
            problems.append("invalid_payload: text must be a string")
        if blocks is not None:
            problems.extend(check_blocks(blocks))
        return problems

    def status_for(self, problems: list[str]) -> int:
        return 404 if problems == ["no_service"] else 400

    def rejection(self, problems: list[str]) -> Any:
        return problems[0].split(":")[0] if problems else "invalid_payload"

    def answer(self, body: Any) -> Any:
        return "ok"

    def _take_fault(self) -> _Fault | None:
        fault = super()._take_fault()
        if fault is not None or self._interval is None:
            return fault
        with self._pace_lock:
            now = time.monotonic()
            if self._last is not None and now - self._last < self._interval:
                return _Fault(1, 429, {"Retry-After": str(self._retry_after)})
            self._last = now
        return None

    def fault_reply(self, fault: _Fault) -> Any:
        return "rate_limited" if fault.status == 429 else "internal_error"

    @staticmethod
    def message_text(record: Received) -> str:
        """All the text of a posted message, joined (zero-width spaces removed)."""
        texts: list[str] = []
        _collect(record.body.get("blocks") if isinstance(record.body, dict) else None, texts)
        return " | ".join(t.replace("\u200b", "") for t in texts)


def _collect(node: Any, out: list[str]) -> None:
    if isinstance(node, dict):
        if node.get("type") in TEXT_TYPES and isinstance(node.get("text"), str):
            out.append(node["text"])
        for value in node.values():
            if isinstance(value, dict | list):
                _collect(value, out)
    elif isinstance(node, list):
        for item in node:
            _collect(item, out)


def check_blocks(blocks: Any) -> list[str]:
    """Block Kit's rules for the block types a bridge message uses; each problem is
    prefixed `invalid_payload:` (what Slack answers) and says where."""
    if not isinstance(blocks, list):
        return ["invalid_payload: blocks must be a list"]
    if len(blocks) > MAX_BLOCKS:
        return [f"invalid_payload: {len(blocks)} blocks, at most {MAX_BLOCKS}"]
    problems: list[str] = []
    for index, block in enumerate(blocks):
        where = f"blocks[{index}]"
        if not isinstance(block, dict):
            problems.append(f"{where} is not an object")
            continue
        kind = block.get("type")
        check = _BLOCKS.get(kind) if isinstance(kind, str) else None
        if check is None:
            problems.append(f"{where}: unknown block type {kind!r}")
            continue
        problems.extend(check(block, where))
    return [f"invalid_payload: {p}" for p in problems]


def _text(obj: Any, where: str, limit: int, plain_only: bool = False) -> list[str]:
    if not isinstance(obj, dict) or obj.get("type") not in TEXT_TYPES:
        return [f"{where} must be a text object"]
    if plain_only and obj["type"] != "plain_text":
        return [f"{where} must be plain_text"]
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        return [f"{where}.text must be a non-empty string"]
    problems = [f"{where}.text is {len(text)} characters, at most {limit}"] * (len(text) > limit)
    allowed = (
        {"type", "text", "emoji"} if obj["type"] == "plain_text" else {"type", "text", "verbatim"}
    )
    extra = sorted(set(obj) - allowed)
    if extra:
        problems.append(f"{where}: unknown fields {extra}")
    return problems


def _header(block: dict[str, Any], where: str) -> list[str]:
    return _text(block.get("text"), f"{where}.text", 150, plain_only=True)


def _section(block: dict[str, Any], where: str) -> list[str]:
    text, fields = block.get("text"), block.get("fields")
    if text is None and fields is None:
        return [f"{where} needs text or fields"]
    problems = [] if text is None else _text(text, f"{where}.text", 3000)
    if fields is not None:
        if not isinstance(fields, list) or not 1 <= len(fields) <= 10:
            return [*problems, f"{where}.fields must hold 1 to 10 text objects"]
        for i, field in enumerate(fields):
            problems += _text(field, f"{where}.fields[{i}]", 2000)
    return problems


def _context(block: dict[str, Any], where: str) -> list[str]:
    elements = block.get("elements")
    if not isinstance(elements, list) or not 1 <= len(elements) <= 10:
        return [f"{where}.elements must hold 1 to 10 elements"]
    problems: list[str] = []
    for i, element in enumerate(elements):
        problems += _text(element, f"{where}.elements[{i}]", 3000)
    return problems


def _actions(block: dict[str, Any], where: str) -> list[str]:
    elements = block.get("elements")
    if not isinstance(elements, list) or not 1 <= len(elements) <= 25:
        return [f"{where}.elements must hold 1 to 25 elements"]
    problems: list[str] = []
    ids = [e.get("action_id") for e in elements if isinstance(e, dict)]
    if len([i for i in ids if i]) != len({i for i in ids if i}):
        problems.append(f"{where}: action_id values must be unique")
    for i, button in enumerate(elements):
        at = f"{where}.elements[{i}]"
        if not isinstance(button, dict) or button.get("type") != "button":
            problems.append(f"{at} must be a button")
            continue
        problems += _text(button.get("text"), f"{at}.text", 75, plain_only=True)
        url = button.get("url")
        if url is not None and (not isinstance(url, str) or not 1 <= len(url) <= 3000):
            problems.append(f"{at}.url must be 1 to 3000 characters")
        if button.get("style") not in (None, "primary", "danger"):
            problems.append(f"{at}.style must be primary or danger")
        action_id = button.get("action_id")
        if action_id is not None and (not isinstance(action_id, str) or len(action_id) > 255):
            problems.append(f"{at}.action_id must be at most 255 characters")
    return problems


def _divider(block: dict[str, Any], where: str) -> list[str]:
    return []


_BLOCKS: dict[str, Callable[[dict[str, Any], str], list[str]]] = {
    "header": _header,
    "section": _section,
    "context": _context,
    "actions": _actions,
    "divider": _divider,
}
