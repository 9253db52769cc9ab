"""The enrolment instrument (tests/bench/enrol_bench.py, issue 47), small: the bench's one
pass with budgets gives the figure without budgets, and the figure is shown as what it is
made of: the counted queries at an assumed page latency, and the counted writes."""

from __future__ import annotations

import pytest

from tests.bench import enrol_bench

pytestmark = [pytest.mark.azurite, pytest.mark.slow]


def test_one_pass_with_budgets_gives_the_figure_of_the_pass_without(azurite: str) -> None:
    plain = enrol_bench.run(azurite, 2_000)
    both = enrol_bench.run(azurite, 2_000, with_budgets=True)
    for key in ("enrol_100k_s", "enrol_100k_graph_assumed_s", "enrol_100k_writes_s"):
        assert both[key] == plain[key], (key, both, plain)
    queries = plain["resource_graph_queries_100k"]
    assert both["resource_graph_queries_100k"] == queries
    # The figure is its queries at the assumed latency, the writes hidden behind them but
    # for the last page's.
    assert plain["enrol_100k_graph_assumed_s"] == queries * enrol_bench.azure(
        "resource_graph_query_s"
    )
    assert (
        plain["enrol_100k_s"]
        <= plain["enrol_100k_graph_assumed_s"] + plain["enrol_100k_writes_s"] + 0.2
    )
    assert both["enrol_100k_budgets_writes_s"] > both["enrol_100k_writes_s"]
