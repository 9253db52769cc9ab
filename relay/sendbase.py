"""What every forward target shares: `SendError` and the `Sender` interface.

A module of its own, below senders, servicebus, liveness and identity, so none of them
imports another just for these two names (no import cycle among them).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from relay.models import Envelope


class SendError(Exception):
    """A message was not confirmed. `slow` means retrying soon cannot help."""

    def __init__(
        self, kind: str, message: str, *, slow: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.slow = slow
        self.retry_after = retry_after


class Sender:
    """What a forward target does (FileSender, ServiceBusSender, TableLiveness)."""

    def send(self, envelope: Envelope, body: str) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError
