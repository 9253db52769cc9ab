"""An IMDS Scheduled Events simulator for tests, the demo and rehearsing maintenance.

`Simulator` holds the state (VMs, events, approvals, faults); `SimulatorServer` serves it over
HTTP like IMDS, one base URL per VM, plus a /_sim control API. `python -m simulator`
runs it from the command line.
"""

from simulator.engine import DEFAULT_VM, NotFound, Simulator, SimulatorError
from simulator.faults import Fault
from simulator.records import Approval
from simulator.scenarios import SCENARIOS, EventSpec, ScenarioFileError, load_scenario_file
from simulator.server import SimulatorServer

__all__ = [
    "DEFAULT_VM",
    "SCENARIOS",
    "Approval",
    "EventSpec",
    "Fault",
    "NotFound",
    "ScenarioFileError",
    "Simulator",
    "SimulatorError",
    "SimulatorServer",
    "load_scenario_file",
]
