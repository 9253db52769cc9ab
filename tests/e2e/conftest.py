"""Run the demo's orchestration as a library: real simulator, relays, host, Azurite, receivers."""

from __future__ import annotations

import os
from dataclasses import dataclass

from local.options import DemoOptions
from local.orchestration import Demo
from local.report import Outcome, Timeline

# Settings that would point the demo at real services or change its policy: never inherited.
_FOREIGN = ("TEAMS_", "SLACK_", "PAGERDUTY_", "WEBHOOK_", "POLICY__", "DRAIN__", "RELAY_")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    env.update(extra)
    return env


@dataclass
class Played:
    demo: Demo
    outcomes: list[Outcome]
    timeline: Timeline

    def story(self) -> str:
        """The timeline, for assertion messages: what actually happened."""
        return "\n".join(self.timeline.format(e) for e in self.timeline.snapshot())

    def event_id(self, scenario: str, target: str | None = None) -> str:
        """The event of the first step playing `scenario` (on `target`, if given)."""
        for step, event_id in self.demo.step_events.items():
            if step.scenario == scenario and target in (None, step.target):
                return event_id
        raise AssertionError(f"{scenario} produced no event\n{self.story()}")

    def track(self, scenario: str, target: str | None = None):
        return self.demo.watcher.snapshot()[self.event_id(scenario, target)]

    def approvals(self, scenario: str, target: str | None = None) -> list:
        event_id = self.event_id(scenario, target)
        return [a for a in self.demo.watcher.approvals if a.event_id == event_id]


def play(options: DemoOptions, before=None) -> Played:
    """Start everything, play the plan to the end, stop everything; keep what was observed."""
    timeline = Timeline(stream=None)
    demo = Demo(options, timeline)
    with demo:
        if before is not None:
            before(demo)
        demo.play()
        outcomes = demo.outcomes()
    return Played(demo, outcomes, timeline)
