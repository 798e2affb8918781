"""The swe-sim benchmark's honesty rules: grid points are chosen on seeds that are never
reported, bounded_batch's grid is as fine as the pipeline's, and `auto` is judged against the
best grid point only on points it was not developed on."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import pytest

from conveyor.bench import dispatch as bench
from conveyor.bench.dispatch import simulate
from conveyor.sim.swe import SweSimWorkload

TINY = SweSimWorkload(tasks=3, samples_per_task=2, turns_min=2, turns_max=4, max_live_runtimes=8)


class _RecordingRunner(bench._Runner):
    """The benchmark's own runner (in-process), keeping every job it ran."""

    def __init__(self) -> None:
        super().__init__(1)
        self.jobs: list[tuple[SweSimWorkload, str, dict[str, Any], int]] = []

    def map(self, jobs: list[tuple[SweSimWorkload, str, dict[str, Any], int]]) -> list[Any]:
        self.jobs += jobs
        return super().map(jobs)


def test_grid_points_are_chosen_on_seeds_that_are_never_reported() -> None:
    runner = _RecordingRunner()
    reported = [0, 1]
    point = bench.bench_point(
        TINY, reported, ["bounded_batch", "pipeline"], runner, with_defaults=False
    )
    assert point["tuning_seeds"] == bench.tuning_seeds(2)
    assert not set(point["tuning_seeds"]) & set(reported)
    for name in ("bounded_batch", "pipeline"):
        chosen = point["strategies"][name]["best_knobs"]
        tried = [job for job in runner.jobs if job[1] == name]
        assert len({str(job[2]) for job in tried}) == len(bench.GRIDS[name][1](8))
        # no grid point but the chosen one ever ran on a reported seed
        assert all(job[2] == chosen for job in tried if job[3] in reported)
        assert {job[3] for job in tried if job[2] != chosen} <= set(point["tuning_seeds"])
        # what is reported is the chosen point on the reported seeds
        runs = [simulate(TINY, name, chosen, seed) for seed in reported]
        mean = statistics.fmean(run["makespan_s"] for run in runs)
        assert point["strategies"][name]["makespan_s"] == pytest.approx(mean, rel=1e-12)
    with pytest.raises(ValueError, match="overlap"):
        bench.bench_point(TINY, [0], ["pipeline"], runner, tune_seeds=[0, 1000])


@pytest.mark.parametrize("r", [8, 64, 128, 176, 256, 512])
def test_bounded_batch_grid_is_as_fine_as_the_pipelines(r: int) -> None:
    bounded = [k["max_parallel"] for k in bench._bounded_grid(r)]
    pipeline = bench._pipeline_grid(r)
    # as many points as the pipeline's grid, or every P in R/4..R where there are fewer
    assert len(bounded) >= min(len({str(k) for k in pipeline}), r - r // 4 + 1)
    assert set(bench._pipeline_run_pools(r)) <= set(bounded)
    assert max(bounded) == r
    # between R/4 and R no gap wider than the pipeline's own points would leave
    span = [p for p in bounded if p >= r // 4]
    assert max(b - a for a, b in itertools.pairwise(span)) <= max(1, r // 8)
    assert bench.GRIDS["bounded_batch_overlap"][1](r) == bench._bounded_grid(r)


def test_only_points_auto_was_not_developed_on_are_labelled_fresh() -> None:
    assert set(bench.sweep_points(128)) <= bench.SEEN_BY_AUTO
    assert (1.0, 128) in bench.SEEN_BY_AUTO  # the default point
    assert not set(bench.FRESH_POINTS) & bench.SEEN_BY_AUTO
    report = bench.run_bench(
        seeds=1,
        processes=1,
        strategies=("bounded_batch", "pipeline", "auto"),
        workload=TINY.model_copy(update={"max_live_runtimes": 128}),
    )
    assert report["fresh_for_auto"] is False
    fresh = report["fresh"]
    assert [(row["cpu_factor"], row["max_live_runtimes"]) for row in fresh] == list(
        bench.FRESH_POINTS
    )
    assert all(row["fresh_for_auto"] for row in fresh)
    judged = report["auto_vs_best_grid_on_fresh"]
    assert len(judged["ratios"]) == len(bench.FRESH_POINTS)
    assert judged["min"] == min(row["auto_over_best_grid"] for row in fresh)
    # a row on a seen point is labelled so and left out of the judgement
    seen = bench._row(1.0, 256, _fake_point())
    assert seen["fresh_for_auto"] is False
    assert bench._on_fresh([seen])["ratios"] == {}


def _fake_point() -> dict[str, Any]:
    return {
        "strategies": {},
        "auto_over_best_grid": 0.5,
        "bound_s": 1.0,
        "tight_bound_s": 1.0,
        "bound_terms": {"binding": "cpu"},
    }


def test_the_fresh_grader_bound_leaves_the_reward_off_the_runtime_side() -> None:
    """With one-turn rollouts (nothing charged to a runtime but its stages) and R = 1 the
    coupled term is the runtime-seconds alone: init + reward when the reward holds the
    runtime, init only when a fresh-sandbox grader need not."""
    from conveyor.bench.bound import makespan_bound
    from conveyor.sim.swe import plan_rollout

    one_turn = TINY.model_copy(update={"turns_min": 1, "turns_max": 1, "max_live_runtimes": 1})
    bound = makespan_bound(one_turn, 0)
    plans = [
        plan_rollout(one_turn, 0, task, sample, 0)
        for task in range(one_turn.tasks)
        for sample in range(one_turn.samples_per_task)
    ]
    init_s = sum(plan.init_s for plan in plans)
    reward_s = sum(plan.reward_s for plan in plans)
    assert bound.runtime_engine_s == pytest.approx(init_s + reward_s, rel=1e-9)
    assert bound.runtime_engine_fresh_grader_s == pytest.approx(init_s, rel=1e-9)
    assert (
        makespan_bound(TINY, 0).runtime_engine_fresh_grader_s
        < makespan_bound(TINY, 0).runtime_engine_s
    )


def test_no_fresh_skips_the_fresh_points() -> None:
    report = bench.run_bench(
        seeds=1, processes=1, strategies=("bounded_batch", "auto"), workload=TINY, fresh=False
    )
    assert "fresh" not in report and "auto_vs_best_grid_on_fresh" not in report
    assert set(report["strategies"]) == {"bounded_batch", "auto"}
