"""The monthly cost and the capacity ceiling of one deployment, as plain arithmetic.

Everything here is a pure function of four inputs: the fleet (`Workload`), how the app is
deployed (`Deployment`: instance memory and count from the Bicep, concurrency from
host.json), the measured per-operation `Counts`, and the `PriceTable`. No I/O except
`load_deployment`, so a test can check every number by hand.

Billing as the model counts it (upper bounds where Azure's rule is finer):
- Functions, Flex Consumption on demand: each execution bills max(minimum, measured
  duration) seconds at the instance memory, with no credit for executions sharing an
  instance; plus a price per execution; plus the always-ready baseline of the Bicep's
  always-ready instances (ingest's and reconcile's: issues 38, 46), their memory all month.
- Service Bus Standard: the hourly base charge, and operations by monthly tier; a queue
  message is send + receive + complete, a notification is one send plus receive +
  complete on each subscription.
- Table storage: every request is one transaction (a batch is one); capacity at LRS.
- Log Analytics: bytes of telemetry per execution (the app's log lines measured, the
  platform's request row assumed), pay-as-you-go ingestion.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from functions.cost.counts import Counts
from functions.cost.lines import Line
from functions.cost.prices import CostInputError, PriceTable
from functions.cost.resources import TemplateResources, Traffic, resource_lines, template_resources

HOURS_PER_MONTH = 730  # Azure's billing month
SECONDS_PER_MONTH = HOURS_PER_MONTH * 3600
SWEEPS_PER_MONTH = HOURS_PER_MONTH * 60  # the watchdog runs every minute
ROOT = Path(__file__).resolve().parents[2]


class Workload(BaseModel):
    """The fleet. Each event names one VM; its set-mates may forward it too (counts say)."""

    model_config = ConfigDict(extra="forbid")

    vms: int = Field(ge=1)
    set_size: int = Field(default=20, ge=1)
    events_per_vm_month: float = Field(default=1.0, ge=0)
    heartbeat_seconds: float = Field(default=300.0, ge=1)
    retention_days: float = Field(default=30.0, gt=0)
    # How relays send heartbeats: straight into the liveness table (relays of this release, with
    # --heartbeat-table, as the Bicep installs them), or through Service Bus and a batch
    # execution (relays installed before, or without the table setting).
    heartbeats: Literal["table", "servicebus"] = "table"
    # Share of the relays whose VMs live in the template's VNet and so send through its NAT
    # gateway (the function app always does, with the template's VNet). 1: all of them.
    relays_behind_nat: float = Field(default=1.0, ge=0, le=1)


class Deployment(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instance_memory_mb: int = Field(gt=0)
    max_instances: int = Field(ge=1)
    always_ready_instances: int = Field(default=0, ge=0)  # Flex baseline, billed all month
    max_concurrent_calls: int = Field(ge=1)
    max_concurrent_sessions: int = Field(ge=1)
    session_idle_seconds: float = Field(ge=0)
    # A batch trigger (cardinality many) fires at minMessageBatchSize or after
    # maxBatchWaitTime, whichever comes first (host.json; Functions' defaults if unset).
    batch_min: int = Field(default=1, ge=1)
    batch_max: int = Field(default=1000, ge=1)
    batch_wait_seconds: float = Field(default=30.0, ge=0)
    # The template's other default resources (NAT gateway, Key Vault, alerts, host blobs).
    resources: TemplateResources = Field(default_factory=TemplateResources)


class Volumes(BaseModel):
    """What one month of the fleet does."""

    events: float
    documents: float
    heartbeats: float
    heartbeat_executions: float
    notifications: float
    notify_executions: float
    sweeps: float


class Ceiling(BaseModel):
    name: str
    vms: float  # math.inf when nothing of this kind limits
    formula: str


class Estimate(BaseModel):
    workload: Workload
    deployment: Deployment
    volumes: Volumes
    lines: list[Line]
    parts: dict[str, float]
    total_usd: float
    usd_per_vm_month: float
    ceilings: list[Ceiling]
    capacity_vms: float
    bound_by: str
    counts_measured_at: str
    counts_measured_by: str
    heartbeats_measured_per_execution: float  # the batch the per-heartbeat counts come from
    prices_as_of: str
    unconfirmed_prices: list[str]


# --------------------------------------------------------------------------- volumes


def documents_per_event(workload: Workload, counts: Counts) -> float:
    setmates = workload.set_size - 1
    return counts.documents_per_event_named_vm + setmates * counts.documents_per_event_per_setmate


def heartbeat_batch(workload: Workload, deployment: Deployment, counts: Counts) -> float:
    """Heartbeats per execution: 1 on the session queue; on a batch trigger, what arrives
    before it fires (minMessageBatchSize, or the fleet's rate x maxBatchWaitTime if fewer).
    Relays writing to the table cost no execution at all (see volumes)."""
    if counts.heartbeats_on_sessions:
        return 1.0
    arriving = workload.vms / workload.heartbeat_seconds * deployment.batch_wait_seconds
    fires_at = min(deployment.batch_min, deployment.batch_max)
    return max(1.0, min(float(fires_at), arriving))


def volumes(workload: Workload, counts: Counts, deployment: Deployment) -> Volumes:
    events = workload.vms * workload.events_per_vm_month
    heartbeats = workload.vms * SECONDS_PER_MONTH / workload.heartbeat_seconds
    notifications = events * counts.notifications_per_event
    return Volumes(
        events=events,
        documents=events * documents_per_event(workload, counts),
        heartbeats=heartbeats,
        heartbeat_executions=0.0
        if workload.heartbeats == "table"
        else heartbeats / heartbeat_batch(workload, deployment, counts),
        notifications=notifications,
        notify_executions=notifications * counts.topic_subscriptions,
        sweeps=SWEEPS_PER_MONTH,
    )


def watchdog_requests(vms: float, counts: Counts) -> float:
    return counts.watchdog_requests_per_sweep_base + counts.watchdog_requests_per_sweep_per_vm * vms


def watchdog_seconds(vms: float, counts: Counts) -> float:
    return counts.watchdog_seconds_per_sweep_base + counts.watchdog_seconds_per_sweep_per_vm * vms


# --------------------------------------------------------------------------- cost


def tiered(quantity_millions: float, tiers: list[tuple[float | None, float]]) -> float:
    """Cost of a quantity under (up_to, price) tiers, each price applying to its slice."""
    cost, floor = 0.0, 0.0
    for up_to, price in tiers:
        top = quantity_millions if up_to is None else min(quantity_millions, up_to)
        if top > floor:
            cost += (top - floor) * price
        if up_to is None or quantity_millions <= up_to:
            break
        floor = up_to
    return cost


def functions_lines(
    v: Volumes, w: Workload, d: Deployment, c: Counts, p: PriceTable, free_grants: bool
) -> list[Line]:
    least = p.price("flex_min_billed_seconds")
    billed = (
        v.documents * max(least, c.seconds_per_document)
        + v.heartbeat_executions * max(least, c.seconds_per_heartbeat_execution)
        + v.sweeps * max(least, watchdog_seconds(w.vms, c))
        + v.notify_executions * least
    )
    gb_seconds = billed * d.instance_memory_mb / 1024
    executions = v.documents + v.heartbeat_executions + v.sweeps + v.notify_executions
    paid_gbs, paid_exec = gb_seconds, executions
    if free_grants:
        paid_gbs = max(0.0, gb_seconds - p.price("flex_free_gb_seconds"))
        paid_exec = max(0.0, executions - p.price("flex_free_executions"))
    lines = []
    if d.always_ready_instances:
        count, memory = d.always_ready_instances, d.instance_memory_mb
        baseline = count * memory / 1024 * SECONDS_PER_MONTH
        lines.append(
            Line(
                part="Functions",
                item=f"always-ready baseline, {count} x {memory} MB",
                quantity=baseline,
                unit="GB-s",
                usd=baseline * p.price("flex_always_ready_baseline_gb_second"),
            )
        )
    return [
        *lines,
        Line(
            part="Functions",
            item="executions",
            quantity=executions,
            unit="executions",
            usd=paid_exec / 1e6 * p.price("flex_executions_per_million"),
        ),
        Line(
            part="Functions",
            item=f"execution time at {d.instance_memory_mb} MB",
            quantity=gb_seconds,
            unit="GB-s",
            usd=paid_gbs * p.price("flex_gb_second"),
        ),
    ]


def bus_heartbeats(v: Volumes, w: Workload) -> float:
    """Heartbeats that travel through Service Bus (none when relays write the table)."""
    return v.heartbeats if w.heartbeats == "servicebus" else 0.0


def servicebus_operations(v: Volumes, w: Workload, c: Counts) -> float:
    per_message = c.servicebus_operations_per_message
    receive_side = max(0.0, per_message - 1)  # receive + complete on each subscription
    return (v.documents + bus_heartbeats(v, w)) * per_message + v.notifications * (
        1 + c.topic_subscriptions * receive_side
    )


def servicebus_lines(v: Volumes, w: Workload, c: Counts, p: PriceTable) -> list[Line]:
    operations = servicebus_operations(v, w, c)
    entry = p.prices["servicebus_standard_operations"]
    tiers = [(t.up_to_millions, t.usd_per_million) for t in entry.tiers or []] or [
        (None, entry.value)
    ]
    base = p.price("servicebus_standard_base_per_hour")
    return [
        Line(
            part="Service Bus",
            item="Standard base charge",
            quantity=HOURS_PER_MONTH,
            unit="hours",
            usd=HOURS_PER_MONTH * base,
        ),
        Line(
            part="Service Bus",
            item="operations",
            quantity=operations,
            unit="operations",
            usd=tiered(operations / 1e6, tiers),
        ),
    ]


def relay_table_requests(v: Volumes, w: Workload, c: Counts) -> float:
    """The relays' own Table requests: their heartbeats into the liveness table."""
    return v.heartbeats * c.table_requests_per_relay_heartbeat if w.heartbeats == "table" else 0.0


def table_transactions(v: Volumes, w: Workload, c: Counts) -> float:
    per_heartbeat = (
        c.table_requests_per_relay_heartbeat
        if w.heartbeats == "table"
        else c.table_requests_per_heartbeat
    )
    return (
        v.documents * c.table_requests_per_document
        + v.heartbeats * per_heartbeat
        + v.sweeps * watchdog_requests(w.vms, c)
    )


def nat_traffic(v: Volumes, w: Workload, c: Counts) -> Traffic:
    """What crosses the template's NAT gateway: all of the function app's Table and Service
    Bus traffic, and the share of the relays' (heartbeats, documents) whose VMs live there."""
    relay_tables = relay_table_requests(v, w, c)
    relay_sends = v.documents + bus_heartbeats(v, w)  # one send each
    app_tables = table_transactions(v, w, c) - relay_tables
    app_bus = servicebus_operations(v, w, c) - relay_sends
    return Traffic(
        table_requests=app_tables + w.relays_behind_nat * relay_tables,
        servicebus_operations=app_bus + w.relays_behind_nat * relay_sends,
    )


def table_lines(v: Volumes, w: Workload, c: Counts, p: PriceTable) -> list[Line]:
    transactions = table_transactions(v, w, c)
    events_kept = v.events * w.retention_days / (HOURS_PER_MONTH / 24)
    gigabytes = (w.vms * c.table_bytes_per_vm + events_kept * c.table_bytes_per_event) / 1e9
    return [
        Line(
            part="Table storage",
            item="transactions",
            quantity=transactions,
            unit="transactions",
            usd=transactions / 1e4 * p.price("table_transactions_per_10k"),
        ),
        Line(
            part="Table storage",
            item=f"capacity ({w.retention_days:g} days of events)",
            quantity=gigabytes,
            unit="GB",
            usd=gigabytes * p.price("table_lrs_gb_month"),
        ),
    ]


def log_lines(v: Volumes, c: Counts, p: PriceTable) -> list[Line]:
    executions = v.documents + v.heartbeat_executions + v.sweeps + v.notify_executions
    total = (
        executions * c.platform_log_bytes_per_execution
        + v.documents * c.log_bytes_per_document
        + v.heartbeat_executions * c.log_bytes_per_heartbeat_execution
    )
    gigabytes = total / 1e9
    return [
        Line(
            part="Log Analytics",
            item="ingestion",
            quantity=gigabytes,
            unit="GB",
            usd=gigabytes * p.price("log_analytics_gb"),
        )
    ]


# --------------------------------------------------------------------------- capacity


def ceilings(w: Workload, d: Deployment, c: Counts, p: PriceTable) -> list[Ceiling]:
    """Fleet sizes at which each limit is reached, for this workload's per-VM rates."""
    heartbeat_rate = 1 / w.heartbeat_seconds  # per VM per second
    direct = w.heartbeats == "table"
    bus_heartbeat_rate = 0.0 if direct else heartbeat_rate
    heartbeat_entities = (
        c.table_entities_per_relay_heartbeat if direct else c.table_entities_per_heartbeat
    )
    document_rate = w.events_per_vm_month * documents_per_event(w, c) / SECONDS_PER_MONTH
    notification_rate = w.events_per_vm_month * c.notifications_per_event / SECONDS_PER_MONTH
    out: list[Ceiling] = []

    credits = (
        bus_heartbeat_rate + document_rate
    ) * c.servicebus_credits_per_message + notification_rate * (1 + 2 * c.topic_subscriptions)
    budget = p.limit("servicebus_standard_credits_per_second")
    out.append(
        Ceiling(
            name="Service Bus Standard",
            vms=_over(budget, credits),
            formula=f"{budget:g} credits/s / {credits:.3g} credits/s per VM",
        )
    )

    entities = (
        heartbeat_rate * heartbeat_entities
        + document_rate * c.table_entities_per_document
        + c.watchdog_requests_per_sweep_per_vm / 60
    )
    account = p.limit("table_account_entities_per_second")
    out.append(
        Ceiling(
            name="Table account",
            vms=_over(account, entities),
            formula=f"{account:g} entities/s / {entities:.3g} entities/s per VM",
        )
    )

    hot = (
        heartbeat_rate * heartbeat_entities + document_rate * c.table_entities_per_document
    ) * c.hot_partition_share
    partition = p.limit("table_partition_entities_per_second")
    out.append(
        Ceiling(
            name="Table partition",
            vms=_over(partition, hot),
            formula=f"{partition:g} entities/s / ({c.hot_partition_share:.3g} of "
            f"{hot / c.hot_partition_share:.3g} entities/s per VM on the busiest partition)",
        )
    )

    # Messages one instance takes per second. On a session queue each session slot
    # waits sessionIdleTimeout for a next message that a VM sends minutes later.
    session_rate = d.max_concurrent_sessions / (d.session_idle_seconds + c.seconds_per_document)
    if c.heartbeats_on_sessions:
        hb_rate = d.max_concurrent_sessions / (
            d.session_idle_seconds + c.seconds_per_heartbeat_execution
        )
        hb_how = f"{d.max_concurrent_sessions} sessions / {d.session_idle_seconds:g} s idle"
    else:
        hb_rate = (
            d.max_concurrent_calls * c.heartbeats_per_execution / c.seconds_per_heartbeat_execution
        )
        hb_how = (
            f"{d.max_concurrent_calls} calls x {c.heartbeats_per_execution:g} heartbeats / "
            f"{c.seconds_per_heartbeat_execution:.3g} s"
        )
    instances_per_vm = bus_heartbeat_rate / hb_rate + document_rate / session_rate
    heartbeat_term = (
        "no heartbeat executions (relays write the table)"
        if direct
        else f"1/{w.heartbeat_seconds:g} s / {hb_rate:.3g} heartbeats/s per instance [{hb_how}]"
    )
    out.append(
        Ceiling(
            name="Functions instances",
            vms=_over(d.max_instances, instances_per_vm),
            formula=f"{d.max_instances} instances / ({heartbeat_term} + documents / "
            f"{session_rate:.3g} per instance)",
        )
    )

    sweep = p.limit("watchdog_sweep_seconds")
    slope = c.watchdog_seconds_per_sweep_per_vm
    room = sweep - c.watchdog_seconds_per_sweep_base
    out.append(
        Ceiling(
            name="Watchdog sweep",
            vms=math.inf if slope <= 0 else max(0.0, room / slope),
            formula=(
                f"{c.watchdog_seconds_per_sweep_base:.3g} s of {sweep:g} s, not growing "
                "with the fleet (its queries filter on the server)"
                if slope <= 0
                else f"({sweep:g} s - {c.watchdog_seconds_per_sweep_base:.3g} s) / "
                f"{slope * 1000:.3g} ms per VM"
            ),
        )
    )
    return out


def _over(budget: float, per_vm: float) -> float:
    return math.inf if per_vm <= 0 else budget / per_vm


# --------------------------------------------------------------------------- estimate


def estimate(
    workload: Workload,
    deployment: Deployment,
    counts: Counts,
    prices: PriceTable,
    *,
    free_grants: bool = False,
) -> Estimate:
    v = volumes(workload, counts, deployment)
    lines = [
        *functions_lines(v, workload, deployment, counts, prices, free_grants),
        *servicebus_lines(v, workload, counts, prices),
        *table_lines(v, workload, counts, prices),
        *log_lines(v, counts, prices),
        *resource_lines(deployment.resources, nat_traffic(v, workload, counts), prices),
    ]
    parts: dict[str, float] = {}
    for line in lines:
        parts[line.part] = parts.get(line.part, 0.0) + line.usd
    total = sum(parts.values())
    limits = ceilings(workload, deployment, counts, prices)
    bound = min(limits, key=lambda c: c.vms)
    return Estimate(
        workload=workload,
        deployment=deployment,
        volumes=v,
        lines=lines,
        parts=parts,
        total_usd=total,
        usd_per_vm_month=total / workload.vms,
        ceilings=limits,
        capacity_vms=bound.vms,
        bound_by=bound.name,
        counts_measured_at=counts.measured_at.isoformat(),
        counts_measured_by=counts.measured_by,
        heartbeats_measured_per_execution=counts.heartbeats_per_execution,
        prices_as_of=prices.as_of.isoformat(),
        unconfirmed_prices=prices.unconfirmed(),
    )


# --------------------------------------------------------------------------- deployment


def load_deployment(
    root: Path = ROOT,
    *,
    instance_memory_mb: int | None = None,
    max_instances: int | None = None,
    network: str | None = None,
) -> Deployment:
    """The deployment as this repository ships it: host.json and the Bicep defaults."""
    try:
        host = json.loads((root / "host.json").read_text(encoding="utf-8"))
        bicep = (root / "infra" / "modules" / "functionapp.bicep").read_text(encoding="utf-8")
    except (OSError, json.JSONDecodeError) as exc:
        raise CostInputError(f"cannot read the deployment (host.json, Bicep): {exc}") from None
    bus = host.get("extensions", {}).get("serviceBus", {})
    return Deployment(
        instance_memory_mb=_bicep_default(bicep, "instanceMemoryMB")
        if instance_memory_mb is None
        else instance_memory_mb,
        max_instances=_bicep_default(bicep, "maximumInstanceCount")
        if max_instances is None
        else max_instances,
        always_ready_instances=_bicep_default(bicep, "ingestAlwaysReady")
        + _bicep_default(bicep, "reconcileAlwaysReady"),
        max_concurrent_calls=int(bus.get("maxConcurrentCalls", 16)),
        max_concurrent_sessions=int(bus.get("maxConcurrentSessions", 8)),
        session_idle_seconds=_timespan(str(bus.get("sessionIdleTimeout", "00:01:00"))),
        batch_min=int(bus.get("minMessageBatchSize", 1)),
        batch_max=int(bus.get("maxMessageBatchSize", 1000)),
        batch_wait_seconds=_timespan(str(bus.get("maxBatchWaitTime", "00:00:30"))),
        resources=template_resources(root, network=network),
    )


def _bicep_default(text: str, name: str) -> int:
    match = re.search(rf"^param {name} int = (\d+)", text, re.MULTILINE)
    if match is None:
        raise CostInputError(f"functionapp.bicep has no default for {name}")
    return int(match.group(1))


def _timespan(text: str) -> float:
    """host.json's hh:mm:ss[.fff] as seconds."""
    hours, minutes, seconds = text.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
