"""relay/ has no import cycle, counting imports inside functions too (issue 22).

A cycle that only closes through a function-level import still couples the modules (and
breaks the day someone moves the import to the top), so every `import relay.x` and
`from relay.x import y` anywhere in a module counts as an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

RELAY = Path(__file__).resolve().parents[2] / "relay"


def _edges(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "relay" and len(parts) > 1 and (RELAY / f"{parts[1]}.py").exists():
                found.add(parts[1])
    return found


def import_graph() -> dict[str, set[str]]:
    graph = {p.stem: _edges(p) for p in sorted(RELAY.glob("*.py"))}
    for module, targets in graph.items():
        targets.discard(module)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_relay_modules_import_without_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle in relay/: " + " -> ".join(cycle or [])


def test_the_checker_sees_function_level_imports() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    # senders imports liveness inside build_sender: the graph holds that edge.
    assert "liveness" in import_graph()["senders"]
