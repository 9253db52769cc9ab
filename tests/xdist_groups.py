"""Keep `--dist loadgroup` grouping under pytest 9, and start the slow tests first (a
plugin: tests/conftest.py imports its hook, and tests/test_xdist_groups.py loads it alone
with -p).

pytest-xdist 3.8 (the newest on PyPI) marks a test of an `xdist_group` by appending
"@<group>" to `item._nodeid`; pytest 9 keeps a node's id in `item._id`, so the mark was
lost and every worker that got one of a group's tests ran the group's module fixture
again (the demo played up to four times per `make test`). This sets the same suffix where
pytest 9 reads it; a no-op once xdist does it itself (the suffix is already there).
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep `--dist loadgroup` grouping under pytest 9: pytest-xdist 3.8 (the newest on
    PyPI) marks a grouped test by appending "@<group>" to `item._nodeid`, but pytest 9
    keeps a node's id in `item._id`, so the mark was lost and every worker that got one
    of a group's tests ran the group's module fixture again (the demo played up to four
    times per `make test`). The same suffix, set where pytest 9 reads it."""
    if not getattr(config.option, "loadgroup", False):
        return  # set on xdist workers only, when --dist loadgroup
    # The suite is CPU-bound on two cores: the tests marked slow (the crash explorer's
    # scenarios, up to a minute each, and the demo) go first, so the short ones fill the
    # workers around them instead of one of them ending the run alone. Every worker
    # collects in this same order (stable: the rest keep theirs).
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    from _pytest.nodeid import coerce_node_id

    for item in items:
        names = {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
        if names and "@" not in item.nodeid.rpartition("]")[2]:
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(sorted(names))}")  # type: ignore[attr-defined]
