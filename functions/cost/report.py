"""The estimate as a table people read (`python -m functions cost`)."""

from __future__ import annotations

import math
import textwrap

from functions.cost.model import Estimate


def _quantity(value: float, unit: str) -> str:
    if unit in ("GB", "GB-s") and value < 1000:
        return f"{value:,.2f} {unit}"
    for size, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if value >= size:
            return f"{value / size:,.1f}{suffix} {unit}"
    return f"{value:,.0f} {unit}"


def _usd(value: float) -> str:
    return f"{value:,.2f}" if value >= 1 else f"{value:.4f}"


def _vms(value: float) -> str:
    return "no limit" if math.isinf(value) else f"{math.floor(value):,} VMs"


def render(e: Estimate) -> str:
    w, d = e.workload, e.deployment
    lines = [
        f"Fleet: {w.vms:,} VMs in sets of {w.set_size}, {w.events_per_vm_month:g} event(s) "
        f"per VM-month, a heartbeat every {w.heartbeat_seconds:g} s "
        + (
            "straight into the liveness table (no message, no execution)"
            if w.heartbeats == "table"
            else "through Service Bus (relays installed before the table path)"
        ),
        f"Deployment: Flex Consumption {d.instance_memory_mb} MB instances ("
        + (
            f"{d.always_ready_instances} always ready for ingest and reconcile"
            if d.always_ready_instances
            else "always ready off"
        )
        + f"), at most {d.max_instances}; Service Bus Standard; Table storage LRS; "
        + (
            f"the template's VNet with a NAT gateway ({w.relays_behind_nat:.0%} of the "
            "relays behind it)"
            if d.resources.network == "new"
            else "your VNet and egress (no NAT gateway)"
        ),
        f"Counts: measured {e.counts_measured_at} ({e.counts_measured_by})"
        + (
            f", Service Bus heartbeats {e.heartbeats_measured_per_execution:g} per execution"
            if w.heartbeats == "servicebus"
            else ""
        ),
        f"Prices: list, USD, as of {e.prices_as_of}",
        "",
        f"{'part':<14} {'item':<34} {'per month':>22} {'USD':>12}",
        "-" * 85,
    ]
    for line in e.lines:
        lines.append(
            f"{line.part:<14} {line.item:<34} {_quantity(line.quantity, line.unit):>22} "
            f"{_usd(line.usd):>12}"
        )
    lines.append("-" * 85)
    for part, usd in e.parts.items():
        lines.append(f"{part:<14} {'':<34} {'':>22} {_usd(usd):>12}")
    lines.append(f"{'total':<14} {'':<34} {'':>22} {_usd(e.total_usd):>12}")
    lines.append(f"{'per VM-month':<14} {'':<34} {'':>22} {e.usd_per_vm_month:>12.4f}")
    lines += [
        "",
        f"Capacity of one deployment: {_vms(e.capacity_vms)} (bound by {e.bound_by})",
    ]
    for ceiling in e.ceilings:
        lines.append(f"  {ceiling.name:<22} {_vms(ceiling.vms):>16}  {ceiling.formula}")
    if w.vms > e.capacity_vms:
        needed = math.ceil(w.vms / e.capacity_vms) if e.capacity_vms >= 1 else "no number of"
        lines.append(
            f"  ! {w.vms:,} VMs is over this ceiling: {needed} deployments as configured "
            "(the cost above is for the work, wherever it runs)"
        )
    if e.unconfirmed_prices:
        lines += ["", "Not confirmed on their source page (check them in prices.json):"]
        lines += textwrap.wrap(
            ", ".join(e.unconfirmed_prices), 85, initial_indent="  ", subsequent_indent="  "
        )
    return "\n".join(lines)
