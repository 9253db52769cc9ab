"""functions/ and local/ have no import cycle, counting imports inside functions and under
TYPE_CHECKING too (issues 22 and 37).

Ingest and the Event Grid source once imported each other (one through a function-level
import); each now depends only on the stages below it (functions.pipeline.results). A cycle
that closes only inside a function still couples the modules, so those imports count.
relay/ has its own test (tests/relay/test_imports.py).

local/ had a 10-module cycle: each part (relay_fleet, drain_worker, outcomes, the ledger...)
imported `Demo` back from local.orchestration to type its argument. The parts now take
local.demo_state.DemoState, which imports none of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


PACKAGES = ("functions", "local")


def modules() -> dict[str, Path]:
    found = {}
    for path in (p for package in PACKAGES for p in (ROOT / package).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in known else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t in known and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_functions_and_local_have_no_import_cycle():
    assert cycles(import_graph()) == []


def test_local_is_in_the_graph():
    """The orchestration imports its parts; no part imports it back."""
    graph = import_graph()
    assert "local.relay_fleet" in graph["local.orchestration"]
    assert not [
        name
        for name, targets in graph.items()
        if "local.orchestration" in targets and name not in ("local.cli", "local.demo")
    ]


def test_the_sources_do_not_import_each_other():
    graph = import_graph()
    assert "functions.pipeline.sources.eventgrid_ingest" not in graph["functions.pipeline.ingest"]
    assert "functions.pipeline.ingest" not in graph["functions.pipeline.sources.eventgrid_ingest"]


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
