"""A document can always come back (issue 40): a Freeze's "it is over" document,
dead-lettered by the local host after its deliveries, still ends the event, because the
real relay sends it again while its pending row is there (contract §11).

The demo's stack at 60x: the simulator, a real relay process, Azurite, the local host.
On 2cd3d60 the relay sent that document once and never again: the event stayed Started,
`completed` was never announced (the issue's run, measured on the whole demo).
"""

from __future__ import annotations

import shutil

import pytest

from local.options import DemoOptions
from local.plan import FLEET, Step
from tests.chaos.host_faults import DeadLetter, end_of
from tests.e2e.conftest import clean_env, play

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_dead_lettered_end_document_still_ends_the_event():
    vm = "app-1"
    options = DemoOptions(
        report=None,
        env=clean_env(),
        time_limit=90,
        keep=True,  # the inbox and the relay's log, read below
        fleet=tuple(v for v in FLEET if v.name == vm),
        plan=(Step(at=0.0, scenario="live-migration", target=vm),),
        # Its relay keeps running: the upgrade lane's restart would send the VM's document
        # afresh and end the event without the resend this test is about.
        upgrade_lane=False,
    )
    with DeadLetter(end_of(vm)) as fault:
        played = play(options)
    demo = played.demo
    event_id = played.event_id("live-migration")
    assert fault.hits == 10, f"{fault.note}\n{played.story()}"  # dead-lettered, as on Azure
    assert demo.inbox is not None
    assert [p.name for p in (demo.inbox / "deadletter").glob("*.json")] == [f"{fault.target}.json"]
    announced = demo.publisher.transitions(event_id)
    assert announced[-1] == "completed", played.story()
    assert announced.count("completed") == 1
    log = (demo.workdir / "logs" / f"relay-{vm}.log").read_text()
    shutil.rmtree(demo.workdir, ignore_errors=True)
    # The relay re-sent the dead-lettered document itself, the same sequence.
    assert log.count("relay starting") == 1  # never restarted
    sequence = int(fault.target.split("-", 1)[0])
    assert f"sending it again  sequence={sequence} " in log, log
