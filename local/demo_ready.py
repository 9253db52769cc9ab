"""The relay's readiness probe in the demo (issue 33): the VM whose reboot the demo's policy
drains, and the scale set's VMs (no script of the operator's: the bridge drains them
through the probe, issue 38), run their relay with `--ready-listen`, and a load balancer's
probe is played by a thread asking `/readyz` every 0.1 s, the way Azure Load Balancer asks
every few seconds. Its answers go on the timeline, and an outcome checks the VM left
rotation (503) while drained and came back (200) after the undrain; a scale-in's VM stays
out (it is deleted)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from local.report import Outcome

if TYPE_CHECKING:
    from local.demo_state import DemoState

PATH = "/readyz"
EVERY = 0.1
# Scenarios whose VM is back after the event (the undrain puts it back in rotation).
COMES_BACK = frozenset({"platform-reboot", "user-reboot", "redeploy", "live-migration"})


class ProbeWatcher:
    """Asks one relay's readiness probe until stopped; keeps each change of answer."""

    def __init__(self, demo: DemoState, vm: str, url: str) -> None:
        self.demo, self.vm, self.url = demo, vm, url
        self.answers: list[tuple[float, int]] = []  # (time.time(), status) on change
        self.every = EVERY
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="ready-probe")
        self._thread.start()

    def _ask(self) -> int:
        try:
            with urllib.request.urlopen(self.url + PATH, timeout=2) as answer:  # noqa: S310
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0  # not listening (yet, or any more)

    def _run(self) -> None:
        while not self._stop.wait(EVERY):
            status = self._ask()
            if status and (not self.answers or self.answers[-1][1] != status):
                self.answers.append((time.time(), status))
                what = "in rotation" if status == 200 else "out of rotation"
                self.demo.timeline.add(
                    "relay", self.vm, f"readiness probe {PATH}: {status} ({what})"
                )

    def first_out(self) -> float | None:
        """When it was first seen 503 (time.time()), or None."""
        return next((at for at, status in self.answers if status == 503), None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=3)


def first_out(demo: DemoState, vm: str) -> float | None:
    """When the VM's probe was first seen 503 (time.time()), or None."""
    for watcher in getattr(demo, "ready_probes", []):
        if watcher.vm == vm:
            return watcher.first_out()
    return None


def ready_outcomes(demo: DemoState) -> list[Outcome]:
    """200, then 503 while drained, then 200 again after the undrain; a scale-in's VM is
    deleted, so its probe stays 503."""
    watchers: list[ProbeWatcher] = getattr(demo, "ready_probes", [])
    deleted = {s.target for s in demo.played if s.scenario == "terminate"}
    outcomes = []
    for watcher in watchers:
        watcher.stop()
        seen = [status for _, status in watcher.answers]
        if watcher.vm in deleted:
            name = f"readiness probe of {watcher.vm}: out of rotation before its deletion"
            ok = seen == [200, 503]
        else:
            name = f"readiness probe of {watcher.vm}: out of rotation while drained"
            ok = seen[:1] == [200] and 503 in seen and seen[-1] == 200
        detail = " -> ".join(map(str, seen)) or "never answered"
        why = _not_drained_by_your_policy(demo, watcher.vm)
        if why is not None:  # only the demo's policy drains it: shown, not judged
            outcomes.append(
                Outcome(f"{name} [demo's policy]", ok, f"{detail}; {why}", skipped=True)
            )
            continue
        outcomes.append(Outcome(name, ok, detail))
    return outcomes


def _not_drained_by_your_policy(demo: DemoState, vm: str) -> str | None:
    """With your POLICY__*: why the demo's drain of this VM is not what your policy did."""
    if not getattr(demo, "custom_policy", False):
        return None
    from local.outcomes import differs_from_the_demo

    for step in demo.played:
        event_id = demo.step_events.get(step)
        drained = step.drain or step.scenario == "terminate"
        if step.target == vm and drained and event_id:
            why = differs_from_the_demo(demo, event_id)
            if why is not None:
                return why
    return None
