"""The demo's channels keep what they cannot deliver, as the function app does (issue 40):
each channel's subscription gives a post Service Bus's 10 deliveries, the last one keeps it
in the deliveries table (Azurite), and this worker plays the `notify_kept` timer (every
2 minutes, scaled like the simulator's clock), sending kept posts once the channel is back.
A kept post is recorded as delivered only when it is sent; one still kept at the end is
recorded as not delivered, saying so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from local.narration import subject

if TYPE_CHECKING:
    from functions.notify.delivery import Transport
    from functions.notify.settings import ChannelSettings
    from functions.store.deliveries import DeliveryLedger
    from local.demo_state import DemoState

KEPT = "kept"  # what a channel handler returns for a post it kept (local.subscription)
EVERY_SECONDS = 120.0  # functions.triggers.notify.KEPT_SCHEDULE, at real speed


class KeptWorker:
    """Sends the channels' kept posts every `every` seconds until stopped."""

    def __init__(
        self,
        demo: DemoState,
        ledger: DeliveryLedger,
        settings: ChannelSettings,
        transport: Transport,
        every: float,
        record: Callable[[str, Any, bool, str | None], None],
    ) -> None:
        self.demo, self.ledger, self.settings, self.transport = demo, ledger, settings, transport
        self.every = every
        self.record = record  # (channel, note, posted, error): the demo's delivery records
        self.channels: list[str] = []
        self._stop = threading.Event()
        self._pass = threading.Lock()  # one pass at a time: a kept post is sent once
        self._thread = threading.Thread(target=self._run, name="kept-posts", daemon=True)

    def start(self) -> KeptWorker:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.pass_once()

    def pass_once(self) -> None:
        with self._pass:
            self._pass_once()

    def _pass_once(self) -> None:
        from functions.notify.dispatch import resend_kept

        for channel in list(self.channels):
            try:
                report = resend_kept(
                    channel, settings=self.settings, transport=self.transport, ledger=self.ledger
                )
            except Exception as exc:  # Azurite trouble: the next pass tries again
                self.demo.timeline.add("notify", channel, f"kept posts: {exc}", ok=False)
                continue
            # The notes as resend read them: a post kept after a read of our own (its last
            # delivery failing as the channel came back) was a KeyError here, which ended
            # this thread and left every later kept post unsent and unrecorded.
            for message_id in report.sent:
                self._done(channel, report.notes[message_id], None, "sent late, once it was back")
            for message_id, why in report.dropped:
                note = report.notes.get(message_id)  # None: its body no longer read
                if note is None:
                    self.demo.timeline.add("notify", channel, f"kept post {why}", ok=False)
                else:
                    self._done(channel, note, why, why)

    def pending(self) -> int:
        """Kept posts not sent yet, after one more pass (a channel back meanwhile)."""
        self.pass_once()
        return sum(len(self.ledger.kept(channel)) for channel in self.channels)

    def unsent(self) -> int:
        """Kept posts not sent yet, counted between two passes (a pass in flight is waited
        for, so a post it sent is recorded already). Unlike `pending`, sends nothing: the
        timer keeps its pace, and what waits for the late posts (the chaos runner's settle)
        waits for this to be 0, not for a time."""
        with self._pass:
            return sum(len(self.ledger.kept(channel)) for channel in self.channels)

    def _done(self, channel: str, note: Any, error: str | None, said: str) -> None:
        self.record(channel, note, error is None, error)
        self.demo.timeline.add(
            "notify", subject(note), f"{channel}: kept '{note.transition.value}' {said}"
        )

    def stop(self) -> None:
        """Stop, after a last pass; what is still kept is recorded as not delivered."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.pass_once()
        from functions.model.event import Notification

        for channel in self.channels:
            for post in self.ledger.kept(channel):
                note = Notification.from_json(post.body)
                why = f"kept, never sent: {channel} did not come back ({post.reason})"
                self.record(channel, note, False, why)


def kept_by(ledger: DeliveryLedger, channel: str, note: Any) -> bool:
    """Whether the channel kept this post (its last delivery failed) rather than having
    nothing to send."""
    record = ledger.get(note.message_id(), channel)
    return record is not None and record.status == "kept"
