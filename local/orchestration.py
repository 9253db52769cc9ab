"""The demo's orchestration: start everything, play the plan, check, stop everything.

`Demo` is a library: `python -m local.demo`, the end-to-end tests and the bench
all drive it. It starts the receivers, the IMDS simulator, Azurite and the local functions
host, one real relay per VM, then plays each step and records what every part observed.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import requests

from functions.model.policy import PolicyLoad
from functions.notify.settings import PAGERDUTY_EVENTS_URL
from local.azurite import free_port
from local.channels import (
    Delivery,
    channel_values,
    pagerduty_action,
    short_retries,
    slack_pacer,
)
from local.demo_backtest import run_backtest
from local.demo_budget import budget_outcomes, due_steps, held_impact, place_fleet, sync_placements
from local.demo_ledger import CLOCK_DIR, ledger_outcomes
from local.demo_ledger import LEAD as LEDGER_LEAD
from local.demo_ready import ready_outcomes
from local.demo_state import DemoState
from local.demo_upgrade import prepare_upgrade_lane, upgrade_outcomes
from local.drain_worker import start_drain_worker
from local.kept_worker import EVERY_SECONDS, KEPT, KeptWorker, kept_by
from local.narration import announcement, receiver_news, subject
from local.options import DemoOptions
from local.outcomes import check_outcomes
from local.plan import DEMO_BUDGETS, DEMO_RULES, Step, demo_policy
from local.receivers import (
    DrainHookReceiver,
    PagerDutyReceiver,
    Received,
    Receiver,
    TeamsReceiver,
    WebhookReceiver,
)
from local.relay_fleet import start_relays
from local.report import Outcome, Timeline
from local.slack_receiver import SlackReceiver
from local.subscription import Subscription
from local.watcher import EventTrack, FleetWatcher


class Demo(DemoState):
    """Starts everything, plays the plan, checks the outcomes, stops everything."""

    def __init__(self, options: DemoOptions | None = None, timeline: Timeline | None = None):
        super().__init__(options, timeline)
        self._pending_steps: list[Step] = []
        self.transport: Any = None  # the channels' (functions.notify.delivery.Transport)
        # What PagerDuty paged (the deliveries table's marks), for the narration.
        self.channel_marks: Any = None

    # ------------------------------------------------------------------ start-up
    def start(self) -> Demo:
        o = self.options
        self.timeline.add(
            "demo",
            "demo",
            f"{len(o.fleet)} VMs, {len(o.plan)} scenarios at {o.time_scale:g}x "
            f"(15 min of notice takes {900 / o.time_scale:.0f} s)",
        )
        self.stack.callback(self.host_clock.start().stop)  # first, so it stops last
        self._find_missing_parts()
        if self.custom_policy:
            self.timeline.add(
                "decide", "policy", "your POLICY__* settings decide; policy checks only inform"
            )
        else:
            names = ", ".join(rule.name for rule in DEMO_RULES)
            budgets = "; ".join(
                f"budget {b.name}: {b.max_unavailable} out at a time per {', '.join(b.group_by)}"
                for b in DEMO_BUDGETS
            )
            self.timeline.add("decide", "policy", f"{self.policy_source}: {names} first; {budgets}")
        self._start_receivers()
        self._start_simulator()
        if "local functions host" not in self.missing:
            self._start_host()
        if "relays" not in self.missing:
            self._start_relays()
        if "local functions host" not in self.missing:
            self._start_event_grid()
        self.upgrade_lane = prepare_upgrade_lane(self)
        if self.upgrade_lane is not None:
            self.stack.callback(self.upgrade_lane.stop_probes)
        self.watcher = FleetWatcher(self.sim, self.timeline, on_new=self._attach_step).start()
        self.stack.callback(self.watcher.stop)
        return self

    def _find_missing_parts(self) -> None:
        """Say clearly which part of the pipeline is not there, instead of failing on it."""
        import importlib.util

        parts = {
            "relays": ("relay.__main__", "python -m relay is not available"),
            "local functions host": ("local.host", "local/host.py is missing"),
            "terminate workflow": (
                "functions.terminate.workflow",
                "functions/terminate/workflow.py is missing",
            ),
        }
        for part, (module, why) in parts.items():
            try:
                found = importlib.util.find_spec(module) is not None
            except ImportError:
                found = False
            if not found:
                self.missing[part] = why
                self.timeline.add("demo", part, f"not running: {why}", ok=False)

    def _start_receivers(self) -> None:
        env = self.options.env
        wanted: list[tuple[str, Callable[[], Receiver], str | None]] = [
            ("teams", lambda: TeamsReceiver(on_receive=self._told), env.get("TEAMS_WEBHOOK_URL")),
            (
                "pagerduty",
                lambda: PagerDutyReceiver(on_receive=self._told),
                # A routing key alone means PagerDuty itself (PAGERDUTY_EVENTS_URL optional).
                (env.get("PAGERDUTY_EVENTS_URL") or PAGERDUTY_EVENTS_URL)
                if env.get("PAGERDUTY_ROUTING_KEY")
                else None,
            ),
            ("webhook", lambda: WebhookReceiver(on_receive=self._told), env.get("WEBHOOK_URL")),
            ("slack", lambda: SlackReceiver(on_receive=self._told), env.get("SLACK_WEBHOOK_URL")),
        ]
        for channel, make, external in wanted:
            if external:
                self.external[channel] = external
                self.timeline.add("demo", channel, "posting to the URL from the environment")
                continue
            self.receivers[channel] = self.stack.enter(make())
        self.receivers["drain"] = self.stack.enter(DrainHookReceiver(on_receive=self._told))
        local = ", ".join(f"{name} {r.url}" for name, r in self.receivers.items())
        self.timeline.add("demo", "receivers", f"listening: {local}")

    def _start_simulator(self) -> None:
        from simulator import Simulator, SimulatorServer
        from simulator.scenarios import DEFAULT_NOTICE

        o = self.options
        self.sim = Simulator(time_scale=self.options.time_scale, type_scales=o.type_scales)
        # A Freeze pauses its VMs' guests, relays included (local.demo_ledger).
        if o.play_freezes:
            self.sim.play_freezes(clock_dir=self.workdir / CLOCK_DIR, lead=LEDGER_LEAD)
        scale_sets: dict[str, list[str]] = {}
        for vm in self.options.fleet:
            if vm.scale_set:
                scale_sets.setdefault(vm.scale_set, []).append(vm.name)
                continue
            self.sim.add_vm(vm.name, availability_set=vm.availability_set, spot=vm.spot)
        for name, members in scale_sets.items():
            # Instances are NAME_0..NAME_{n-1}, with terminate notifications on (notBeforeTimeout).
            added = self.sim.add_scale_set(
                name, len(members), terminate_timeout=self.options.terminate_timeout
            )
            if sorted(added) != sorted(members):
                raise ValueError(f"scale set {name}: instances must be named {added}")
        place_fleet(self.sim, self.options.fleet)  # zones and tags: Azure's facts
        self.server = SimulatorServer(self.sim, host="127.0.0.1", port=0).start()
        self.stack.callback(self.server.stop)
        groups = ", ".join(f"{vm.name} ({vm.group})" for vm in self.options.fleet)
        self.timeline.add("demo", "simulator", f"IMDS simulator at {self.server.url}: {groups}")
        for event_type, scale in o.type_scales.items():
            notice = DEFAULT_NOTICE.get(event_type)
            if notice is not None:
                self.timeline.add(
                    "demo",
                    "simulator",
                    f"{event_type} events play at {scale:g}x: their {notice:g} s notice takes "
                    f"{notice / scale:g} s (at {o.time_scale:g}x it would be "
                    f"{notice / o.time_scale:g} s)",
                )

    def _start_host(self) -> None:
        """Azurite, the local host over the shared inbox, channels and timeline subscribers."""
        from functions.pipeline.admission import Admission
        from functions.pipeline.publish import LocalPublisher
        from functions.settings import load_settings
        from functions.settings_check import checked_settings
        from functions.store.state import Store
        from local.azurite import Azurite
        from local.host import LocalHost
        from simulator.identity import test_issuer

        azurite = self.stack.enter(Azurite())
        self.connection_string = azurite.connection_string
        self.timeline.add("demo", "azurite", f"Table storage on 127.0.0.1:{azurite.port}")
        self.inbox = self.workdir / "inbox"
        # One free port on which every relay listens, each at its own VM's address.
        self.callback_port = free_port()
        self.settings = load_settings(
            state_storage=azurite.connection_string,
            # The app's own secret (wraps the relays' callback keys it stores): one per run.
            app_secret=secrets.token_hex(32),
            relay_callback_port=self.callback_port,
            # The simulator's IMDS signs attested documents with its test CA: trusted here
            # only because it is named (in Azure: the public roots).
            attestation_ca_pem=test_issuer().root_pem,
            # Real-world margins, scaled like the simulator's clock.
            approval_margin_seconds=max(0, round(10 / self.options.time_scale)),
            approval_budget_seconds=max(1, round(60 / self.options.time_scale)),
            # Agentless mode: the simulator's Resource Manager, relays first.
            arm_endpoint=self.server.arm_url,
            arm_fallback_after_seconds=max(1, round(30 / self.options.time_scale)),
        )
        # The app's start-up check (functions.settings_check): settings it refuses make
        # the host fail closed, as in Azure; otherwise the demo's policy unless yours.
        # drain_worker's steps, and the channels' local receivers (or your own URLs).
        checked = checked_settings(self.settings, drain_configured=True, channels_configured=True)
        if self.custom_policy or checked.policy.error:
            self.settings = checked
        else:
            self.settings = self.settings.with_policy(PolicyLoad(policy=demo_policy()))
        self.credential = self._managed_identity()
        if self.settings.policy.error:
            self.timeline.add("decide", "policy", f"INVALID: {self.settings.policy.error}", False)
        self.store = Store.from_settings(self.settings).ensure_tables()
        # Who sent each relay message: the attested document (the simulator's CA), the VM's
        # facts from the simulator's Resource Graph (asked with the app's identity), the
        # identities table on Azurite.
        session = requests.Session()
        self.stack.callback(session.close)
        self.admission = Admission.from_settings(
            self.settings, self.store, session, self.credential
        )
        self.publisher = LocalPublisher()
        # The timeline first (it notes what is announced), then one subscription per channel.
        self.publisher.subscribe("timeline", self._announced)
        self._subscribe_channels()
        host_session = self.stopping.session()
        self.stack.callback(host_session.close)
        self.host = LocalHost(
            self.inbox,
            self.settings,
            self.store,
            self.publisher,
            watchdog_interval_seconds=5,
            # The app's waits and calls (the drain's too) end when the demo stops.
            session=host_session,
            clock=self.stopping.clock(),
            admission=self.admission,
            credential=self.credential,
            # A copy for later after an outage waits as long in the demo's time as in Azure.
            later_scale=1.0 / self.options.time_scale,
        )
        if "terminate workflow" not in self.missing:
            self._start_terminate()  # over the host's pipeline, as in the function app
        # The coverage pass says which drain each VM has under the demo's drain settings.
        self.host.drain_settings = getattr(self, "drain_settings", None)
        # The identity sync's pass (its timer's code), before any relay reports: the
        # placements and group sizes the decider's disruption budgets read.
        sync_placements(self)
        stop = threading.Event()
        thread = threading.Thread(
            target=self.host.run_forever,
            args=(stop,),
            kwargs={"poll_seconds": 0.05},
            name="local-functions-host",
            daemon=True,
        )
        thread.start()

        def stop_host() -> None:
            self.stopping.set()  # no drain from the row starts, those running end
            stop.set()
            thread.join(timeout=10)
            self.host.close(wait=True)  # its sweep's workers, joined

        self.stack.callback(stop_host)
        self.timeline.add("demo", "functions", f"local host reading {self.inbox}")

    def _managed_identity(self) -> Any:
        """The function app's identity: azure-identity's ManagedIdentityCredential, asking
        the simulator's IMDS token endpoint (AZURE_POD_IDENTITY_AUTHORITY_HOST) for tokens
        the simulator's Resource Manager accepts."""
        from azure.identity import ManagedIdentityCredential

        name = "AZURE_POD_IDENTITY_AUTHORITY_HOST"
        before = os.environ.get(name)
        os.environ[name] = self.server.url

        def restore() -> None:
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before

        self.stack.callback(restore)
        return ManagedIdentityCredential()

    def _start_event_grid(self) -> None:
        """Event Grid's stand-in: the opted-in VMs' event changes, as notifications, into
        the same inbox (in Azure: their own queue), with a seeded duplicate now and then
        and an occasional one out of order, as Event Grid delivers."""
        from simulator.eventgrid import EventGridPublisher, directory_sink

        opted = [vm.name for vm in self.options.fleet if vm.event_grid]
        if not opted:
            return
        assert self.inbox is not None
        self.event_grid = EventGridPublisher(
            self.sim,
            directory_sink(self.inbox),
            opted_in=opted,
            schema="cloudevents",
            duplicate_rate=0.3,
            reorder_rate=0.3,
            seed=48,  # with these rates: its first and third notifications come twice
            hold_seconds=0.3,
        ).start()
        self.stack.callback(self.event_grid.stop)
        self.timeline.add(
            "demo",
            "event grid",
            f"publishing {', '.join(opted)} (opted in) to {self.inbox}; Resource Manager at "
            f"{self.server.arm_url}",
        )

    def _subscribe_channels(self) -> None:
        """Each channel is its own subscription, as on the topic; every delivery is recorded."""
        from functions.notify.delivery import RetryPolicy, Transport
        from functions.notify.dispatch import CHANNELS, deliver
        from functions.notify.settings import ChannelSettings
        from functions.store.deliveries import DeliveryLedger

        local = channel_values(self.options.env, self.external, self.receivers)
        channel_settings = ChannelSettings(**local)
        session = requests.Session()
        self.stack.callback(session.close)
        # Short waits: at 60x a real retry schedule would outlast the event. A claim's lease
        # in the demo's time, like the hold through an outage (local.subscription).
        transport = Transport(
            session=session,
            policy=short_retries(RetryPolicy),
            pacer=slack_pacer(self.external, self.options.time_scale),
            lease_scale=1.0 / self.options.time_scale,
        )
        # Posted once per channel, and kept past the last delivery, as in Azure: the
        # deliveries table (Azurite) and the notify_kept timer (local/kept_worker.py).
        ledger = DeliveryLedger.from_connection_string(
            self.connection_string, self.settings.state_table_prefix
        ).ensure_table()
        self.kept = KeptWorker(
            self,
            ledger,
            channel_settings,
            transport,
            EVERY_SECONDS / self.options.time_scale,
            self._record_delivery,
        ).start()
        self.stack.callback(self.kept.stop)
        self.transport = transport
        self.channel_marks = ledger  # the channels mark what PagerDuty paged here
        for channel in CHANNELS:
            off = channel_settings.off_reason(channel)
            if off:
                self.timeline.add("demo", channel, f"channel off: {off}")
                continue

            def handler(note: Any, delivery: int, owner: str, channel: str = channel) -> bool | str:
                posted = deliver(
                    channel,
                    note.to_json(),
                    settings=channel_settings,
                    transport=transport,
                    ledger=ledger,
                    delivery_count=delivery,
                    owner=owner,
                )
                return KEPT if not posted and kept_by(ledger, channel, note) else posted

            self.kept.channels.append(channel)
            subscription = Subscription(
                channel,
                handler,
                on_done=self._channel_done,
                counted=True,
                hold_scale=1.0 / self.options.time_scale,
            ).start()
            self.subscriptions.append(subscription)
            self.stack.callback(subscription.stop)
            self.channels.append(channel)
            self.publisher.subscribe(channel, subscription.put)

    def _record_delivery(self, channel: str, note: Any, posted: bool, error: str | None) -> None:
        with self._lock:
            self.deliveries.append(
                Delivery(
                    channel=channel,
                    message_id=note.message_id(),
                    event_id=note.event.event_id if note.event else None,
                    transition=note.transition.value,
                    posted=posted,
                    error=error,
                    action=pagerduty_action(channel, note) if posted else None,
                )
            )

    def _start_terminate(self) -> None:
        start_drain_worker(self)

    def _start_relays(self) -> None:
        start_relays(self)

    # ------------------------------------------------------------------ playing
    def play(self) -> None:
        """Play each step at its time; return once the fleet is quiet again."""
        o = self.options
        pending = sorted(o.plan, key=lambda s: s.at)
        began = time.monotonic()
        quiet_since: float | None = None
        while True:
            self.check_deadline()
            elapsed = time.monotonic() - began
            for step in due_steps(self, pending, elapsed):  # a budget's turns: on conditions
                pending.remove(step)
                self._play_step(step)
            if self.upgrade_lane is not None:
                self.upgrade_lane.start_at(elapsed)  # while the events flow (issue 44)
            self.hook_script_runs()
            if pending:
                quiet_since = None
            elif self.watcher is not None and not self._waiting_for() and self._all_seen():
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= o.settle:
                    return
            else:
                quiet_since = None
            time.sleep(0.1)

    def _waiting_for(self) -> list[EventTrack]:
        """Events still to play out, except those whose NotBefore lies beyond the demo's hard
        time limit (a predicted failure's 7 days): the demo cannot see them start."""
        assert self.watcher is not None
        horizon = datetime.now(UTC) + timedelta(
            seconds=self.options.time_limit - (time.monotonic() - self._started)
        )
        return [
            track
            for track in self.watcher.active()
            if track.started_at is not None
            or track.not_before is None
            or track.not_before <= horizon
        ]

    def _all_seen(self) -> bool:
        return all(step in self.step_events for step in self.played)

    def _play_step(self, step: Step) -> None:
        self.timeline.add("demo", step.scenario, f"playing on {step.target}: {self._story(step)}")
        from simulator import SimulatorError

        try:
            result = self.sim.play(step.scenario, step.target, held_impact(self, step))
        except SimulatorError as exc:
            self.timeline.add("demo", step.scenario, f"cannot play: {exc}", ok=False)
            self.play_errors.append(Outcome(f"{step.scenario} on {step.target}", False, str(exc)))
            return
        self._pending_steps.append(step)
        self.played.append(step)
        event_id = _event_id(result)
        if event_id:
            self.step_events[step] = event_id

    def _story(self, step: Step) -> str:
        """What to expect, in words. A plan's step without a story gets the scenario's own
        summary; under your policy the demo policy's expectation is only a comparison."""
        from simulator import SCENARIOS

        if not step.story:
            scenario = SCENARIOS.get(step.scenario)
            return scenario.summary if scenario is not None else step.scenario
        what, _, expected = step.story.partition(": ")
        if self.custom_policy and expected:
            # The demo policy's expectation would be a false promise here: yours decides.
            return f"{what} (your policy decides; the summary compares it with the demo's)"
        return step.story

    def _attach_step(self, track: EventTrack) -> None:
        for step, event_id in self.step_events.items():
            if event_id == track.event_id:
                track.step = step
                return
        # The simulator did not return the id: the first new event after a step is its own.
        if self._pending_steps:
            step = self._pending_steps.pop(0)
            self.step_events.setdefault(step, track.event_id)
            track.step = step

    # ------------------------------------------------------------------ observing
    def _told(self, record: Received) -> None:
        """Receivers speak up only for what the timeline would not show otherwise."""
        news = receiver_news(record)
        if news is not None:
            kind, about, text, ok = news
            self.timeline.add(kind, about, text, ok=ok)

    def _announced(self, note: Any) -> None:
        """The timeline's subscription: what was announced and whom it is going to.

        Printed at once, so the story keeps its causal order; the channels deliver on their
        own workers and only a failed delivery adds a line of its own.
        """
        marks = self.channel_marks
        self.timeline.add(*announcement(note, self.channels, marks))

    def _channel_done(self, channel: str, note: Any, posted: Any, error: str | None) -> None:
        """Called by each channel's subscription when it is done with a notification; a
        kept post is recorded once it is sent (local/kept_worker.py)."""
        if posted == KEPT:
            self.timeline.add(
                "notify",
                subject(note),
                f"{channel} kept '{note.transition.value}' after its last delivery: sent "
                "once it is back",
                ok=False,
            )
            return
        self._record_delivery(channel, note, bool(posted) and error is None, error)
        if error:
            self.timeline.add(
                "notify",
                subject(note),
                f"{channel} did not take '{note.transition.value}': {error}",
                ok=False,
            )

    # ------------------------------------------------------------------ outcomes
    def outcomes(self) -> list[Outcome]:
        """What the demo promised, checked against what each part actually observed; then
        the backtest of its own history (local/demo_backtest.py) and each Freeze's impact
        ledger (local/demo_ledger.py), and the budget's lane (local/demo_budget.py), while
        Azurite still runs."""
        return (
            check_outcomes(self)
            + budget_outcomes(self)
            + run_backtest(self)
            + ledger_outcomes(self)
            + ready_outcomes(self)
            + upgrade_outcomes(self)
        )

    # ------------------------------------------------------------------ shutting down
    def close(self) -> None:
        self.stopping.set()  # before anything is stopped: no drain run outlives the demo
        self.stack.close()

    def __enter__(self) -> Demo:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def facts(self) -> dict[str, str]:
        facts = {
            "fleet": ", ".join(f"{vm.name} ({vm.group})" for vm in self.options.fleet),
            "time scale": f"{self.options.time_scale:g}x",
        }
        for channel, url in self.external.items():
            facts[channel] = f"real endpoint {url.split('?')[0]}"
        for part, why in self.missing.items():
            facts[f"missing: {part}"] = why
        return facts


def _event_id(result: Any) -> str | None:
    if isinstance(result, str):
        return result
    for attr in ("event_id", "EventId", "id"):
        value = getattr(result, attr, None)
        if isinstance(value, str):
            return value
    if isinstance(result, dict):
        return result.get("EventId") or result.get("event_id")
    if isinstance(result, list | tuple) and result:
        return _event_id(result[0])
    return None
