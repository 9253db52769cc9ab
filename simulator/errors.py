"""The simulator's refusals, shared by the engine and the modules it is built from."""

from __future__ import annotations


class SimulatorError(ValueError):
    """A request the simulator cannot honour; the message says why (the control API's 400)."""


class NotFound(SimulatorError):
    """An unknown VM or event (the control API's 404)."""


class Conflict(SimulatorError):
    """An event in a state that does not allow the request (ARM's 409)."""
