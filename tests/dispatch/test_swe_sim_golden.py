"""Refactors keep the dispatcher's behaviour: fixed (strategy, knobs, seed) points of the swe-sim
workload reproduce the makespans recorded at 8855dc9 to the last digit."""

import json
from pathlib import Path

import pytest

from conveyor.bench.dispatch import simulate
from conveyor.sim.swe import SweSimWorkload

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "swe_sim_golden.json").read_text())


@pytest.mark.parametrize(
    "point", GOLDEN, ids=[f"{p['strategy']}-seed{p['seed']}-{i}" for i, p in enumerate(GOLDEN)]
)
def test_swe_sim_makespan_is_unchanged(point: dict) -> None:
    result = simulate(SweSimWorkload(), point["strategy"], point["knobs"], point["seed"])
    assert repr(result["makespan_s"]) == point["makespan_s"]
    assert result["statuses"] == point["statuses"]
