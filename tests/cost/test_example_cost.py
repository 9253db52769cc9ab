"""The README says what a deploy creates, the example scale set included, and what that
costs (issue 38): its figure is the price table's, for the size and count the template and
the worked example deploy."""

from __future__ import annotations

import re
from pathlib import Path

from functions.cost.prices import load_prices
from functions.cost.resources import HOURS_PER_MONTH
from tests.infra.bicep import INFRA, load, parse_bicepparam

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_names_the_example_scale_set_and_its_cost():
    readme = (ROOT / "README.md").read_text()
    deploy = readme[readme.index("## Deploy") : readme.index("## First checks")]
    example = parse_bicepparam(INFRA / "main.bicepparam")
    assert example["deployExampleScaleSet"] is True  # the worked example deploys it
    count = example["exampleInstanceCount"]
    size = load("vmss-relay").param_default("vmSize")
    prices = load_prices()
    hourly = prices.price(f"vm_{size.lower()}_linux_per_hour")
    monthly = count * (
        HOURS_PER_MONTH * hourly + prices.price("managed_disk_standard_ssd_e4_month")
    )
    times = "\N{MULTIPLICATION SIGN}"
    said = re.search(rf"{count} {times}\s+{size}.*?about (\d+) USD a month", deploy, re.S)
    assert said, "the README's deploy section names the example's size, count and cost"
    assert int(said.group(1)) == round(monthly), (said.group(1), monthly)
    assert f"{hourly:g} USD" in deploy
    # How to leave it out, and that the SSH key is then not asked for.
    assert "deployExampleScaleSet" in deploy and "no SSH key" in deploy
