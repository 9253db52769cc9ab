"""Issue 45: on a busy machine `make demo` failed outcomes without saying why (49 of 66 at
a load average of about 14). The demo now measures its own lag (local/lag.py): before it
starts, a busy machine plays at a slower time scale, said on the first timeline line; a
failed outcome on a machine that was busy while it played is said to be possibly the
machine's. On 2f59d6a there was no such measure (local.lag does not exist)."""

from __future__ import annotations

from local.lag import LagMeter, choose_scale


def test_a_quiet_machine_keeps_the_time_scale():
    assert choose_scale(60.0, lag=0.001, load=0.3).scale == 60.0
    assert choose_scale(60.0, lag=0.001, load=0.3).note == ""


def test_a_busy_machine_plays_slower_and_says_so():
    pace = choose_scale(60.0, lag=0.040, load=1.0)
    assert pace.scale == 30.0
    assert pace.note.startswith("this machine is busy (timer lag 40 ms, load 1.0 per core)")
    assert "playing at 30x instead of 60x" in pace.note
    assert choose_scale(60.0, lag=0.001, load=7.0).scale == 20.0  # very busy: a third


def test_the_meter_says_a_failure_may_be_the_machines():
    meter = LagMeter()
    meter.samples = [0.001] * 9 + [0.2, 0.3]
    meter.loads = [0.5]
    assert "may be the machine's, not the bridge's" in meter.verdict(failed=2)
    assert meter.verdict(failed=0) == ""  # nothing failed: nothing to explain
    quiet = LagMeter()
    quiet.samples, quiet.loads = [0.001] * 10, [0.4]
    assert quiet.verdict(failed=2) == ""


def test_the_installs_say_what_they_do():
    """Issue 45: a cold `make demo` spent about 4 minutes in installs with no output (pip
    --quiet, then `npm ci` at loglevel error). Each install now says when it starts, pip
    prints what it collects, and npm says when it is done."""
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    start = makefile.index("$(STAMP): requirements.txt")
    recipes = makefile[start : makefile.index("lint:", start)]
    assert "--quiet" not in recipes and "--loglevel=error" not in recipes
    assert recipes.count('@echo "install:') >= 2
