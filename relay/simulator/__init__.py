"""An IMDS Scheduled Events simulator for tests, the demo and rehearsing maintenance.

`Simulator` holds the state (VMs, events, approvals, faults); `SimulatorServer` serves it over
HTTP like IMDS, one base URL per VM, plus a /_sim control API. `python -m relay.simulator`
runs it from the command line.
"""

from relay.simulator.engine import DEFAULT_VM, NotFound, Simulator, SimulatorError
from relay.simulator.faults import Fault
from relay.simulator.records import Approval
from relay.simulator.scenarios import SCENARIOS, EventSpec, ScenarioFileError, load_scenario_file
from relay.simulator.server import SimulatorServer

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
