"""`python -m functions cost`: its output, its files, and what bad input gets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from functions.__main__ import main
from functions.cost.counts import COUNTS_FILE, load_counts
from functions.cost.prices import PRICES_FILE, REQUIRED_LIMITS, REQUIRED_PRICES, load_prices

ROOT = Path(__file__).resolve().parents[2]


def test_table_by_part_and_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--vms", "1000"]) == 0
    out = capsys.readouterr().out
    for part in ("Functions", "Service Bus", "Table storage", "Log Analytics", "per VM-month"):
        assert part in out
    assert "Fleet: 1,000 VMs in sets of 20" in out
    assert "Capacity of one deployment:" in out
    for ceiling in ("Service Bus Standard", "Table account", "Table partition", "Functions"):
        assert ceiling in out
    assert f"measured {load_counts().measured_at.isoformat()}" in out  # the counts it used


def test_json_agrees_with_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["cost", "--vms", "5000", "--set-size", "3", "--heartbeat-seconds", "600", "--json"]
    assert main([*args, "--instance-memory-mb", "512", "--max-instances", "100"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"]["vms"] == 5000 and data["workload"]["set_size"] == 3
    assert data["deployment"]["instance_memory_mb"] == 512
    assert data["deployment"]["max_instances"] == 100
    assert data["volumes"]["heartbeats"] == pytest.approx(5000 * 730 * 3600 / 600)
    assert data["total_usd"] == pytest.approx(sum(line["usd"] for line in data["lines"]))
    assert data["usd_per_vm_month"] == pytest.approx(data["total_usd"] / 5000)


def test_counts_from_a_bench_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    counts = json.loads(COUNTS_FILE.read_text())
    counts["measured_by"] = "a bench run"
    bench = tmp_path / "bench.txt"
    bench.write_text("measure  value\n----\n" + json.dumps({"x": 1, "counts": counts}) + "\n")
    assert main(["cost", "--vms", "100", "--counts", str(bench)]) == 0
    assert "(a bench run)" in capsys.readouterr().out


@pytest.mark.parametrize("vms", ["-1", "0"])
def test_no_fleet_is_exit_2(vms: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--vms", vms]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cost: --vms:") and "greater than or equal to 1" in err


@pytest.mark.parametrize(
    ("option", "value"),
    [("--max-instances", "0"), ("--instance-memory-mb", "0"), ("--heartbeat-seconds", "0")],
)
def test_impossible_deployment_is_exit_2(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cost", "--vms", "10", option, value]) == 2
    assert capsys.readouterr().err.startswith(f"cost: {option}:")


def test_malformed_price_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "prices.json"
    broken.write_text("{not json")
    assert main(["cost", "--vms", "10", "--prices", str(broken)]) == 2
    assert f"cost: {broken}: not JSON" in capsys.readouterr().err

    prices = json.loads(PRICES_FILE.read_text())
    del prices["prices"]["flex_gb_second"]["source"]
    broken.write_text(json.dumps(prices))
    assert main(["cost", "--vms", "10", "--prices", str(broken)]) == 2
    assert "prices.flex_gb_second.source: Field required" in capsys.readouterr().err

    prices = json.loads(PRICES_FILE.read_text())
    prices["prices"]["table_lrs_gb_month"]["value"] = -1
    broken.write_text(json.dumps(prices))
    assert main(["cost", "--vms", "10", "--prices", str(broken)]) == 2
    assert "table_lrs_gb_month.value" in capsys.readouterr().err


def test_missing_counts_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--vms", "10", "--counts", str(tmp_path / "none.json")]) == 2
    assert "none.json" in capsys.readouterr().err


def test_every_price_and_limit_is_dated_and_sourced() -> None:
    table = load_prices()
    assert set(REQUIRED_PRICES) <= set(table.prices)
    assert set(REQUIRED_LIMITS) <= set(table.limits)
    raw = json.loads(PRICES_FILE.read_text())
    for section in ("prices", "limits"):
        for name, entry in raw[section].items():
            assert entry["as_of"] and entry["source"].strip(), name
            source = entry["source"].split()[0]
            assert source.startswith("https://") or (ROOT / source).is_file(), name
            if not entry["confirmed"]:
                assert "not confirmed" in entry["note"].lower(), name  # it says so


def test_committed_counts_were_measured() -> None:
    counts = load_counts()
    assert counts.measured_by.startswith("make bench")
    assert set(counts.assumed) >= {
        "servicebus_operations_per_message",
        "platform_log_bytes_per_execution",
    }


def test_module_entry_point() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "functions", "cost", "--vms", "-3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "--vms" in done.stderr and not done.stdout
