"""The cost model's arithmetic on a small example worked out by hand (numbers in comments)."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime

import pytest

from functions.cost.counts import Counts
from functions.cost.model import Deployment, Workload, estimate, tiered, volumes
from functions.cost.prices import Entry, PriceTable, Tier
from functions.cost.resources import TemplateResources


def entry(value: float, tiers: list[Tier] | None = None) -> Entry:
    return Entry(
        value=value, unit="u", as_of=date(2026, 11, 22), source="test", confirmed=True, tiers=tiers
    )


PRICES = PriceTable(
    currency="USD",
    region="test",
    as_of=date(2026, 11, 22),
    prices={
        "flex_gb_second": entry(0.00001),
        "flex_always_ready_baseline_gb_second": entry(0.000002),
        "flex_executions_per_million": entry(1.0),
        "flex_min_billed_seconds": entry(1.0),
        "flex_free_gb_seconds": entry(100_000),
        "flex_free_executions": entry(250_000),
        "servicebus_standard_base_per_hour": entry(0.01),
        "servicebus_standard_operations": entry(
            1.0,
            [
                Tier(up_to_millions=13, usd_per_million=0),
                Tier(up_to_millions=None, usd_per_million=1.0),
            ],
        ),
        "table_transactions_per_10k": entry(0.01),
        "table_lrs_gb_month": entry(0.1),
        "log_analytics_gb": entry(2.0),
        "nat_gateway_per_hour": entry(0.04),
        "nat_gateway_per_gb": entry(0.05),
        "public_ip_standard_per_hour": entry(0.005),
        "key_vault_operations_per_10k": entry(0.03),
        "log_alert_rule_5min_month": entry(1.5),
        "metric_alert_series_month": entry(0.1),
        "blob_hot_lrs_gb_month": entry(0.02),
        "blob_write_operations_per_10k": entry(0.05),
    },
    limits={
        "servicebus_standard_credits_per_second": entry(1000),
        "table_account_entities_per_second": entry(20000),
        "table_partition_entities_per_second": entry(2000),
        "watchdog_sweep_seconds": entry(60),
    },
    assumptions={
        "nat_bytes_per_table_request": entry(1000),
        "nat_bytes_per_servicebus_operation": entry(2000),
        "key_vault_reads_per_secret_month": entry(100),
        "host_blob_writes_per_minute": entry(4),
        "host_blob_gb": entry(0.5),
    },
)

COUNTS = Counts(
    measured_at=datetime(2026, 11, 22, tzinfo=UTC),
    measured_by="hand",
    table_requests_per_document=4,
    table_entities_per_document=4,
    seconds_per_document=0.5,
    log_bytes_per_document=100,
    documents_per_event_named_vm=3,
    documents_per_event_per_setmate=0,
    notifications_per_event=4,
    heartbeats_per_execution=10,
    heartbeats_on_sessions=False,
    table_requests_per_heartbeat=0.1,
    table_entities_per_heartbeat=1,
    seconds_per_heartbeat_execution=2.0,
    log_bytes_per_heartbeat_execution=0,
    table_requests_per_relay_heartbeat=1,
    table_entities_per_relay_heartbeat=1,
    hot_partition_share=0.5,
    watchdog_requests_per_sweep_base=2,
    watchdog_requests_per_sweep_per_vm=0.001,
    watchdog_seconds_per_sweep_base=0.5,
    watchdog_seconds_per_sweep_per_vm=0,
    table_bytes_per_vm=1000,
    table_bytes_per_event=5000,
    topic_subscriptions=4,
    servicebus_operations_per_message=3,
    servicebus_credits_per_message=2,
    platform_log_bytes_per_execution=1000,
)

DEPLOYMENT = Deployment(
    instance_memory_mb=1024,
    max_instances=10,
    max_concurrent_calls=16,
    max_concurrent_sessions=32,
    session_idle_seconds=30,
    batch_min=10,
    batch_max=1000,
    batch_wait_seconds=30,
    # your own VNet: no NAT gateway (tests/cost/test_resources.py prices the template's)
    resources=TemplateResources(
        network="existing", key_vault_secrets=2, log_alert_rules=3, metric_alert_series=4
    ),
)

# 2,628 s between heartbeats: 1,000 heartbeats per VM in a 730-hour month, sent the old way
# (Service Bus and a batch execution); TABLE_WORKLOAD is the same fleet with relays that
# write their heartbeats into the VM table.
WORKLOAD = Workload(
    vms=1000, set_size=2, events_per_vm_month=1, heartbeat_seconds=2628, heartbeats="servicebus"
)
TABLE_WORKLOAD = WORKLOAD.model_copy(update={"heartbeats": "table"})


def test_volumes() -> None:
    v = volumes(WORKLOAD, COUNTS, DEPLOYMENT)
    assert v.events == 1000
    assert v.documents == 3000  # 3 from the named VM, 0 from its one set-mate
    assert v.heartbeats == 1_000_000
    # the trigger fires at 10 (minMessageBatchSize): 1,000 VMs / 2,628 s x 30 s is 11.4
    assert v.heartbeat_executions == 100_000
    assert v.notifications == 4000
    assert v.notify_executions == 16_000  # 4 subscriptions
    assert v.sweeps == 43_800  # 730 h x 60


def test_an_always_ready_instance_bills_its_memory_all_month() -> None:
    """Issue 38: the ingest function's always-ready instance (Flex's baseline: its memory,
    every second of the month, no free grant) is a line of its own; none, no line."""
    ready = DEPLOYMENT.model_copy(update={"always_ready_instances": 1})
    lines = {line.item: line for line in estimate(WORKLOAD, ready, COUNTS, PRICES).lines}
    baseline = lines["always-ready baseline, 1 x 1024 MB"]
    assert baseline.quantity == 730 * 3600  # 1 GB for 730 hours
    assert baseline.usd == pytest.approx(730 * 3600 * 0.000002)
    plain = estimate(WORKLOAD, DEPLOYMENT, COUNTS, PRICES)
    assert not [line for line in plain.lines if "always-ready" in line.item]
    assert estimate(WORKLOAD, ready, COUNTS, PRICES).total_usd == pytest.approx(
        plain.total_usd + baseline.usd
    )


def test_the_shipped_deployment_has_ingest_always_ready() -> None:
    from functions.cost.model import load_deployment

    assert load_deployment().always_ready_instances == 2  # infra/modules/functionapp.bicep


def test_cost_by_part() -> None:
    e = estimate(WORKLOAD, DEPLOYMENT, COUNTS, PRICES)
    lines = {(line.part, line.item.split(" ")[0]): line for line in e.lines}
    # billed seconds: 3,000 x 1 (min) + 100,000 x 2 + 43,800 x 1 (min) + 16,000 x 1 = 262,800
    assert lines["Functions", "execution"].quantity == pytest.approx(262_800)  # at 1 GB
    assert lines["Functions", "execution"].usd == pytest.approx(2.628)
    # 3,000 + 100,000 + 43,800 + 16,000 executions at $1 per million
    assert lines["Functions", "executions"].usd == pytest.approx(0.1628)
    assert lines["Service Bus", "Standard"].usd == pytest.approx(7.30)  # 730 h x $0.01
    # (3,000 + 1,000,000) x 3 + 4,000 x (1 + 4 x 2) = 3,045,000: inside the 13 M included
    assert lines["Service Bus", "operations"].quantity == pytest.approx(3_045_000)
    assert lines["Service Bus", "operations"].usd == 0
    # 3,000 x 4 + 1,000,000 x 0.1 + 43,800 x (2 + 0.001 x 1,000) = 243,400 transactions
    assert lines["Table storage", "transactions"].quantity == pytest.approx(243_400)
    assert lines["Table storage", "transactions"].usd == pytest.approx(0.2434)
    # 1,000 x 1,000 B + (1,000 events x 30 / 30.4167 days) x 5,000 B
    assert lines["Table storage", "capacity"].quantity == pytest.approx(0.0059315, rel=1e-4)
    # 162,800 executions x 1,000 B + 3,000 documents x 100 B = 0.1631 GB at $2
    assert lines["Log Analytics", "ingestion"].quantity == pytest.approx(0.1631)
    assert lines["Log Analytics", "ingestion"].usd == pytest.approx(0.3262)
    # the template's other resources, whatever the fleet: 2 secrets x 100 reads at $0.03 per
    # 10k (0.0006); 3 log alert rules x $1.5 + 4 metric series x $0.1 (4.9); 43,800 minutes
    # x 4 lease writes at $0.05 per 10k (0.876) + 0.5 GB of blobs at $0.02 (0.01): 5.7866
    assert e.parts["Key Vault"] == pytest.approx(0.0006)
    assert e.parts["Alerts"] == pytest.approx(4.9)
    assert e.parts["Blob storage"] == pytest.approx(0.886)
    assert e.total_usd == pytest.approx(10.660993 + 5.7866, rel=1e-6)
    assert e.usd_per_vm_month == pytest.approx(0.016447593, rel=1e-6)
    assert set(e.parts) == {
        "Functions",
        "Service Bus",
        "Table storage",
        "Log Analytics",
        "Key Vault",
        "Alerts",
        "Blob storage",
    }


def test_free_grants_only_when_asked() -> None:
    e = estimate(WORKLOAD, DEPLOYMENT, COUNTS, PRICES, free_grants=True)
    lines = {(line.part, line.item.split(" ")[0]): line for line in e.lines}
    assert lines["Functions", "execution"].usd == pytest.approx((262_800 - 100_000) * 0.00001)
    assert lines["Functions", "executions"].usd == 0  # 162,800 < 250,000 free


def test_ceilings() -> None:
    e = estimate(WORKLOAD, DEPLOYMENT, COUNTS, PRICES)
    limits = {c.name: c.vms for c in e.ceilings}
    # credits per VM-second: (1000 + 3) / 2,628,000 x 2 + 4 / 2,628,000 x (1 + 2 x 4)
    assert limits["Service Bus Standard"] == pytest.approx(1000 * 2_628_000 / 2042)
    # entities on the busiest partition: (1000 x 1 + 3 x 4) / 2,628,000 x 0.5
    assert limits["Table partition"] == pytest.approx(2000 * 2_628_000 / 506)
    per_vm = 1012 / 2_628_000 + 0.001 / 60
    assert limits["Table account"] == pytest.approx(20000 / per_vm)
    # one instance: 16 calls x 10 heartbeats / 2 s; documents: 32 sessions / (30 + 0.5) s
    instances = (1 / 2628) / 80 + (3 / 2_628_000) / (32 / 30.5)
    assert limits["Functions instances"] == pytest.approx(10 / instances)
    assert math.isinf(limits["Watchdog sweep"])  # no per-VM sweep time measured
    assert e.capacity_vms == pytest.approx(1000 * 2_628_000 / 2042)
    assert e.bound_by == "Service Bus Standard"


def test_heartbeats_on_sessions_wait_for_the_idle_timeout() -> None:
    counts = COUNTS.model_copy(
        update={"heartbeats_on_sessions": True, "heartbeats_per_execution": 1}
    )
    e = estimate(
        Workload(vms=1000, heartbeat_seconds=300, heartbeats="servicebus"),
        DEPLOYMENT,
        counts,
        PRICES,
    )
    functions = next(c for c in e.ceilings if c.name == "Functions instances")
    # issue 11: 32 sessions / (30 s idle + 2 s) per instance, a heartbeat every 300 s
    rate = 32 / 32
    documents = 1 * 3 / 2_628_000 / (32 / 30.5)
    assert functions.vms == pytest.approx(10 / (1 / 300 / rate + documents))


def test_small_fleets_fill_smaller_batches() -> None:
    small = WORKLOAD.model_copy(update={"vms": 438})  # 438 / 2,628 s x 30 s = 5 per batch
    assert volumes(small, COUNTS, DEPLOYMENT).heartbeat_executions == pytest.approx(438 * 1000 / 5)
    one = WORKLOAD.model_copy(update={"vms": 10})  # fewer than one per wait: one each
    assert volumes(one, COUNTS, DEPLOYMENT).heartbeat_executions == pytest.approx(10 * 1000)
    on_sessions = COUNTS.model_copy(update={"heartbeats_on_sessions": True})
    assert volumes(WORKLOAD, on_sessions, DEPLOYMENT).heartbeat_executions == 1_000_000


def test_heartbeats_into_the_table_cost_one_transaction_and_no_message_or_execution() -> None:
    v = volumes(TABLE_WORKLOAD, COUNTS, DEPLOYMENT)
    assert v.heartbeats == 1_000_000 and v.heartbeat_executions == 0
    e = estimate(TABLE_WORKLOAD, DEPLOYMENT, COUNTS, PRICES)
    lines = {(line.part, line.item.split(" ")[0]): line for line in e.lines}
    # billed seconds: 3,000 x 1 (min) + 43,800 x 1 + 16,000 x 1 = 62,800 at 1 GB
    assert lines["Functions", "execution"].quantity == pytest.approx(62_800)
    assert lines["Functions", "executions"].usd == pytest.approx(0.0628)
    # 3,000 x 3 + 4,000 x (1 + 4 x 2): no heartbeat on the bus
    assert lines["Service Bus", "operations"].quantity == pytest.approx(45_000)
    # 3,000 x 4 + 1,000,000 x 1 + 43,800 x (2 + 0.001 x 1,000) = 1,143,400 transactions
    assert lines["Table storage", "transactions"].quantity == pytest.approx(1_143_400)
    assert lines["Table storage", "transactions"].usd == pytest.approx(1.1434)
    # 62,800 executions x 1,000 B + 3,000 documents x 100 B
    assert lines["Log Analytics", "ingestion"].quantity == pytest.approx(0.0631)
    limits = {c.name: c.vms for c in e.ceilings}
    # credits per VM-second: 3 / 2,628,000 x 2 + 4 / 2,628,000 x (1 + 2 x 4)
    assert limits["Service Bus Standard"] == pytest.approx(1000 * 2_628_000 / 42)
    assert limits["Table partition"] == pytest.approx(2000 * 2_628_000 / 506)  # as before
    documents = (3 / 2_628_000) / (32 / 30.5)  # no heartbeat executions at all
    assert limits["Functions instances"] == pytest.approx(10 / documents)
    assert e.bound_by == "Functions instances"  # 9.2 M VMs, before the partition's 10.4 M


def test_tiers() -> None:
    tiers = [(13.0, 0.0), (100.0, 0.8), (2500.0, 0.5), (None, 0.2)]
    assert tiered(10, tiers) == 0
    assert tiered(50, tiers) == pytest.approx(37 * 0.8)
    assert tiered(3000, tiers) == pytest.approx(87 * 0.8 + 2400 * 0.5 + 500 * 0.2)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("vms", 0),
        ("vms", -5),
        ("set_size", 0),
        ("heartbeat_seconds", 0),
        ("events_per_vm_month", -1),
    ],
)
def test_workload_refuses_nonsense(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Workload(**{"vms": 10, field: value})


def test_report_says_when_the_fleet_is_over_the_ceiling() -> None:
    from functions.cost.report import render

    within = render(estimate(WORKLOAD, DEPLOYMENT, COUNTS, PRICES))
    assert "over this ceiling" not in within
    assert "Capacity of one deployment: 1,286,973 VMs (bound by Service Bus Standard)" in within
    bigger = WORKLOAD.model_copy(update={"vms": 2_000_000})
    over = render(estimate(bigger, DEPLOYMENT, COUNTS, PRICES))
    assert "2,000,000 VMs is over this ceiling: 2 deployments as configured" in over
