"""The function app's functions as the host indexes them, built once per test process.

`FunctionApp.get_functions()` builds the functions from the registered blueprints and
refuses a second build in the same process ("does not have a unique function name"), so
every test that needs them takes them from here.
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def indexed_functions() -> tuple[Any, ...]:
    import function_app

    return tuple(function_app.app.get_functions())
