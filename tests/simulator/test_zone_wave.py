"""Zones and tags in the simulator (issue 39): Azure's facts about each VM, answered by its
Resource Graph, and a zone-wide maintenance wave over several scale sets of one service."""

from __future__ import annotations

import pytest

from simulator import Simulator
from simulator.arm import ArmService
from simulator.cli import build_parser, build_simulator
from simulator.errors import NotFound, SimulatorError

CHECKOUT = {"service": "checkout"}


def wave_fleet() -> Simulator:
    sim = Simulator(time_scale=60.0)
    sim.add_scale_set("checkout-a", 2, zone="1", tags=CHECKOUT)
    sim.add_scale_set("checkout-b", 2, zone="1", tags=CHECKOUT)
    sim.add_scale_set("checkout-c", 2, zone="2", tags=CHECKOUT)
    sim.add_vm("checkout-1", zone="1", tags=CHECKOUT)
    sim.add_vm("search-1", zone="1", tags={"service": "search"})
    sim.add_vm("regional")
    return sim


def test_a_zone_wave_gives_every_vm_of_the_zone_its_own_event_at_once():
    sim = wave_fleet()
    ids = sim.play("zone-wave", target="zone:1")
    events = [sim.event(i) for i in ids]
    assert sorted(r for e in events for r in e.resources) == [
        "checkout-1",
        "checkout-a_0",
        "checkout-a_1",
        "checkout-b_0",
        "checkout-b_1",
        "search-1",
    ]
    assert all(len(e.resources) == 1 for e in events)
    assert {e.not_before for e in events} == {events[0].not_before}  # one wave
    assert {(e.event_type, e.source) for e in events} == {("Reboot", "Platform")}
    # Each VM sees its own event, and its set-mates' (IMDS shows a set's events to all).
    seen = {e["EventId"] for e in sim.document("checkout-a_0")["Events"]}
    assert {ids[i] for i, e in enumerate(events) if e.resources[0].startswith("checkout-a")} == seen


def test_a_wave_defaults_to_the_first_zone_and_can_take_one_service():
    sim = wave_fleet()
    first = sim.play("zone-wave")
    assert len(first) == 6
    service = sim.play("zone-wave", target="tag:service=checkout")
    assert len(service) == 7  # both zones, every set of the service, the single VM
    with pytest.raises(NotFound, match="no VM in 'zone:3'"):
        sim.play("zone-wave", target="zone:3")
    with pytest.raises(SimulatorError, match="tag:NAME=VALUE"):
        sim.play("zone-wave", target="tag:service")


def test_a_wave_needs_a_zone():
    sim = Simulator()
    sim.add_vm("solo")
    with pytest.raises(SimulatorError, match="needs a VM in an availability zone"):
        sim.play("zone-wave")


def test_tag_targets_compare_names_loosely_values_exactly():
    """As Azure does: tag names case-insensitively, values case-sensitively."""
    sim = wave_fleet()
    assert sim._resolve_target("tag:SERVICE=search", None) == ["search-1"]
    with pytest.raises(NotFound):
        sim._resolve_target("tag:service=Search", None)


def test_resource_graph_answers_tags_and_zones():
    arm = ArmService(wave_fleet())
    rows = {"/".join(r["id"].split("/")[-3:]): r for r in arm.inventory() if "vmId" in r}
    assert rows["checkout-c/virtualMachines/1"]["zones"] == ["2"]
    assert rows["Microsoft.Compute/virtualMachines/checkout-1"]["tags"] == CHECKOUT
    regional = rows["Microsoft.Compute/virtualMachines/regional"]
    assert regional["zones"] is None and regional["tags"] is None


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda s: s.add_vm("z", zone="one two"), "not a zone"),
        (lambda s: s.add_vm("t", tags={"a/b": "x"}), "not one Azure allows"),
        (lambda s: s.add_vm("v", tags={"a": "x" * 257}), "at most 256"),
        (lambda s: s.add_vm("w", tags={f"t{i}": "x" for i in range(51)}), "at most 50"),
    ],
)
def test_placements_azure_would_refuse_are_refused(call, words):
    with pytest.raises(SimulatorError, match=words):
        call(Simulator())


def test_flags_place_and_tag_vms_and_sets():
    args = build_parser().parse_args(
        [
            "--scale-set",
            "web:2",
            "--vm",
            "db",
            "--zone",
            "web:2",
            "--tag",
            "web:service=checkout",
            "--tag",
            "db:tier=data",
        ]
    )
    sim = build_simulator(args)
    assert sim.describe_vm("web_1")["zone"] == "2"
    assert sim.describe_vm("web_0")["tags"] == CHECKOUT
    assert (
        sim.describe_vm("db")["tags"] == {"tier": "data"} and sim.describe_vm("db")["zone"] is None
    )
    with pytest.raises(SimulatorError, match="NAME:KEY=VALUE"):
        build_simulator(build_parser().parse_args(["--vm", "a", "--tag", "a:novalue"]))
