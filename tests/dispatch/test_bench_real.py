"""The real dispatch workload: every strategy on the same engine and tasks, in rotated order,
starting cold, repeated so its ratios carry a spread."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.bench.real import reset_caches, rotated, run_real
from conveyor.config import load_config
from conveyor.tasks.swe.codesearch.index import IndexCache

STRATEGIES = ("bounded_batch", "pipeline", "auto")


def test_real_workload_rotates_the_order_resets_caches_and_repeats(model_dir: Path) -> None:
    """The built-in families with the simulated engine (fast; the tokenizer, stages and
    dispatchers are the real ones): every strategy runs once per round, each round rotated,
    every run after a cache reset, and the ratios are taken per round with their spread."""
    config = load_config(
        Path("configs/quickstart-eval.yaml"),
        [
            "engine.kind=simulated",
            "tasks.num_tasks=2",
            "tasks.group_size=2",
            "agent.max_turns=2",
            "dispatch.max_parallel=4",
            "dispatch.p_run=4",
        ],
    ).config
    report = asyncio.run(run_real(config, STRATEGIES, repeats=3))
    orders = [[run["strategy"] for run in report["runs"] if run["round"] == r] for r in range(3)]
    assert orders == [list(STRATEGIES), list(STRATEGIES[1:] + STRATEGIES[:1]),
                      list(STRATEGIES[2:] + STRATEGIES[:2])]  # fmt: skip
    # every strategy took every place once
    for name in STRATEGIES:
        places = {run["position"] for run in report["runs"] if run["strategy"] == name}
        assert places == {0, 1, 2}
    assert all("code_indexes_dropped" in run["reset"] for run in report["runs"])
    assert len(report["runs"]) == 9
    for numbers in report["strategies"].values():
        assert numbers["runs"] == 3
        span = numbers["makespan_s"]
        assert 0 < span["min"] <= span["mean"] <= span["max"] and span["std"] >= 0
        assert sum(numbers["statuses"].values()) == 3 * report["trajectories"]
    ratio = report["ratios"]["pipeline_over_bounded_batch"]
    per_round = [
        next(r["makespan_s"] for r in report["runs"] if r["round"] == i and r["strategy"] == b)
        / next(r["makespan_s"] for r in report["runs"] if r["round"] == i and r["strategy"] == p)
        for i in range(3)
        for b, p in [("bounded_batch", "pipeline")]
    ]
    assert ratio["min"] == min(per_round) and ratio["max"] == max(per_round)
    assert "auto_over_bounded_batch" in report["ratios"]


def test_rotation_puts_every_strategy_first_once() -> None:
    names = ["a", "b", "c", "d"]
    assert {rotated(names, r)[0] for r in range(4)} == set(names)
    assert rotated(names, 5) == ["b", "c", "d", "a"]


class _FakeEngineWithPrefixReset:
    """Stands in for an engine with `reset_prefix_cache` (the in-process vLLM engine gets one
    from the engines layer; its own test belongs there)."""

    def __init__(self) -> None:
        self.resets = 0

    async def reset_prefix_cache(self) -> None:
        self.resets += 1


def test_reset_caches_empties_the_prefix_cache_and_every_code_index(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "mod.py").write_text("def answer():\n    return 42\n")
    cache = IndexCache()
    cache.get(project)
    cache.get(project)
    assert cache.builds == 1  # warm: the second strategy would not pay the build
    engine = _FakeEngineWithPrefixReset()
    done = asyncio.run(reset_caches(engine))
    assert done["prefix_cache"] is True and engine.resets == 1
    assert done["code_indexes_dropped"] >= 1
    cache.get(project)
    assert cache.builds == 2  # cold again
    # an engine without the method is reported, not silently taken as reset
    assert asyncio.run(reset_caches(object()))["prefix_cache"] is False


@pytest.mark.slow
def test_real_workload_reports_every_strategy(model_dir: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor.cli",
            "bench",
            "dispatch",
            "--workload",
            "real",
            "--json",
            "--strategies",
            "bounded_batch,pipeline",  # the fast test above rotates three strategies
            "--repeats",
            "2",
            "--set",
            "tasks.num_tasks=2",
            "--set",
            "tasks.group_size=2",
            "--set",
            "agent.max_turns=2",
            "--set",
            "agent.max_completion_tokens=24",
            "--set",
            "dispatch.max_parallel=4",
            "--set",
            "dispatch.p_run=4",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["trajectories"] == 8
    assert set(report["strategies"]) == {"bounded_batch", "pipeline"}
    for numbers in report["strategies"].values():
        assert numbers["makespan_s"]["min"] > 0 and numbers["runs"] == 2
        assert 0 < numbers["first_group_fraction"]["max"] <= 1
        assert 0 <= numbers["engine_utilisation"]["max"] <= 1
        assert sum(numbers["statuses"].values()) == 2 * 8  # every rollout, each with its status
        assert 0 <= numbers["mean_reward"] <= 1
    assert report["ratios"]["pipeline_over_bounded_batch"]["min"] > 0
    # every run started with vLLM's prefix cache really emptied, not only the code indexes
    assert all(run["reset"]["prefix_cache"] is True for run in report["runs"])
