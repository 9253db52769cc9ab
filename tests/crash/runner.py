"""Run a scenario's script once, with at most one fault, retrying as Azure would.

A scenario is a list of steps, each one call of a public entry point of the app:
- `deliver(body)`: a relay message on the documents queue (functions.pipeline.ingest.
  ingest_message), or `event_grid(body)`: an Event Grid event on EVENTGRID_QUEUE;
- `drain()`: the `terminate` subscription's handler for every message pending on it, as
  functions.triggers.terminate wires it (run_undrain for an ended drained event, run_drain
  for a `decided` drain, both over functions.terminate.wiring.pipeline_context);
- `notify()`: every channel's subscription (functions.notify.dispatch.deliver, with the
  deliveries ledger, as functions.triggers.notify does);
- `watchdog()`: one tick of functions.pipeline.watchdog.run_watchdog;
- `manual(event_id, who)`: a person approves on the pages (functions.web.approval.
  approve_by_hand); a page that answered with an error (the host died) is asked again;
- `advance(s)`: the FakeClock moves on (nothing is ever slept for real).

When a step dies (HostCrash), it is retried as Azure retries it: a Service Bus message
(a document, an Event Grid event, a topic message) is delivered again to a fresh host
after the lock duration the Bicep gives the queue and subscriptions (the dead host never
completes or abandons it); a watchdog tick is simply the next timer tick, 60 s later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from functions.notify import dispatch
from functions.pipeline.ingest import ingest_message
from functions.pipeline.sources.eventgrid_ingest import ingest_event_grid
from functions.pipeline.watchdog import run_watchdog
from functions.terminate.wiring import pipeline_context
from functions.terminate.workflow import run_drain, run_undrain, wants, wants_undrain
from functions.web.approval import approve_by_hand
from tests.crash.faults import HostCrash
from tests.crash.world import CHANNELS, WEBHOOK_SECRET, Host, World, bicep_lock_seconds
from tests.functions.conftest import T0, write_liveness

WATCHDOG_PERIOD_SECONDS = 60.0  # functions.triggers.core: the watchdog's timer, every minute
LOCK_SECONDS = bicep_lock_seconds()


@dataclass(frozen=True)
class Step:
    kind: str  # deliver | event_grid | drain | notify | watchdog | manual | advance
    label: str
    body: str = ""
    seconds: float = 0.0


def deliver(body: str, label: str) -> Step:
    return Step("deliver", label, body=body)


def event_grid(body: str, label: str) -> Step:
    return Step("event_grid", label, body=body)


def drain() -> Step:
    return Step("drain", "drain")


def notify() -> Step:
    return Step("notify", "notify")


def watchdog() -> Step:
    return Step("watchdog", "watchdog")


def manual(event_id: str, who: str) -> Step:
    return Step("manual", f"manual {who} {event_id}", body=event_id)


def advance(seconds: float) -> Step:
    return Step("advance", f"+{seconds:g}s", seconds=seconds)


def dead_letter(subscription: str, transition: str) -> Step:
    """The `transition` messages pending on `subscription` are dead-lettered: never
    handled (what the one decider must make up for from the row)."""
    return Step("dead_letter", f"dead-letter {subscription} {transition}", body=subscription)


def heartbeat(vm: str, at: float) -> Step:
    """`vm`'s relay writes its liveness row, for its heartbeat `at` seconds after T0: the
    relay's write, not the app's (no crash point; it does not die with the app's host)."""
    return Step("heartbeat", f"heartbeat {vm}", body=vm, seconds=at)


def settle(*gaps: float, channels: bool = False) -> list[Step]:
    """The end of every scenario: for each gap, the clock moves on, the watchdog sweeps,
    and whatever it announced is drained (and delivered, in a channel scenario)."""
    steps: list[Step] = []
    for gap in gaps:
        steps += [advance(gap), watchdog(), drain(), *([notify()] if channels else [])]
    return steps


@dataclass
class Outcome:
    crashed_in: str = ""  # the step the fault hit ("" : it never fired)
    longest_step_seconds: float = 0.0  # FakeClock time one invocation took, at most
    errors: list[str] = field(default_factory=list)  # exceptions a step raised (not crashes)


def run(world: World, steps: list[Step]) -> Outcome:
    outcome = Outcome()
    world.faults.armed = True
    try:
        for index, step in enumerate(steps):
            world.faults.step = index
            _run_step(world, step, outcome)
    finally:
        world.faults.armed = False
    return outcome


def _run_step(world: World, step: Step, outcome: Outcome) -> None:
    clock = world.clock
    if step.kind == "advance":
        clock.advance(step.seconds)
        return
    if step.kind == "dead_letter":
        wanted = step.label.rsplit(" ", 1)[-1]
        for note in world.topic.pending(step.body):
            if note.transition.value == wanted:
                world.topic.complete(step.body, note)
        return
    if step.kind == "heartbeat":
        with world.faults.paused():
            write_liveness(world.host.store, step.body, T0 + timedelta(seconds=step.seconds))
        return
    action = ACTIONS[step.kind]
    for _ in range(MAX_DELIVERIES):
        try:
            _timed(world, outcome, lambda: action(world, world.host, step))
            return
        except HostCrash:
            outcome.crashed_in = outcome.crashed_in or step.label
        # The host is dead: the step is retried on a fresh one, as Azure would (and the
        # fresh one may die too: a double fault, tests.crash.faults `twice`).
        clock.advance(WATCHDOG_PERIOD_SECONDS if step.kind == "watchdog" else LOCK_SECONDS)
        world.faults.revive()
        world.host = world.boot()
    raise RuntimeError(f"{step.label}: the host died on every one of {MAX_DELIVERIES} tries")


MAX_DELIVERIES = 3  # a fault, and a second one on the redelivery


def _timed(world: World, outcome: Outcome, call: Callable[[], None]) -> None:
    start = world.clock.now()
    try:
        call()
    except HostCrash:
        raise
    except Exception as exc:  # an invocation that failed: Service Bus would redeliver it
        outcome.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
    finally:
        took = (world.clock.now() - start).total_seconds()
        outcome.longest_step_seconds = max(outcome.longest_step_seconds, took)


def _deliver(world: World, host: Host, step: Step) -> None:
    ingest_message(step.body, host.pipeline, message_id=step.label)


def _event_grid(world: World, host: Host, step: Step) -> None:
    ingest_event_grid(step.body, host.pipeline, message_id=step.label)


def _drain(world: World, host: Host, step: Step) -> None:
    """functions.triggers.terminate.terminate_drain, for each pending message in order."""
    ctx = pipeline_context(host.pipeline, host.drains, (WEBHOOK_SECRET.encode(),))
    for note in world.topic.pending("terminate"):
        if wants_undrain(note):
            run_undrain(
                note, world.undrain_settings, ctx, drain_hook=world.drain_settings.relay_hook
            )
        elif wants(note):
            run_drain(note, world.drain_settings, ctx)
        world.topic.complete("terminate", note)
        world.faults.settled()


def _notify(world: World, host: Host, step: Step) -> None:
    """functions.triggers.notify, one channel subscription after the other."""
    for channel in CHANNELS:
        for note in world.topic.pending(channel):
            world.delivering = note.message_id()
            dispatch.deliver(
                channel,
                note.to_json(),
                settings=world.channel_settings,
                transport=host.transport,
                ledger=host.ledger,
                message_id=note.message_id(),
            )
            world.topic.complete(channel, note)
            world.faults.settled()
    world.delivering = ""


def _watchdog(world: World, host: Host, step: Step) -> None:
    run_watchdog(host.pipeline)


def _manual(world: World, host: Host, step: Step) -> None:
    approve_by_hand(host.pipeline, step.body, step.label.split(" ")[1])


ACTIONS: dict[str, Callable[[World, Host, Step], None]] = {
    "deliver": _deliver,
    "event_grid": _event_grid,
    "drain": _drain,
    "notify": _notify,
    "watchdog": _watchdog,
    "manual": _manual,
}
