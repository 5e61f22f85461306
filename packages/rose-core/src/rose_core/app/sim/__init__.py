"""`rose sim`: a discrete-event cluster simulator driving the real scheduler and co-serving policies."""

from rose_core.app.sim.scenario import Scenario, load_scenario, shipped_scenarios
from rose_core.app.sim.scenario_run import run_scenario, to_json

__all__ = ["Scenario", "load_scenario", "run_scenario", "shipped_scenarios", "to_json"]
