"""`conveyor bench rl-async`: the RL loop's schedule of generation and updates, simulated with
separate devices for engine and trainer."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conveyor.bench.rl_async import TrainerModel, schedule
from conveyor.cli import app


def test_the_schedule_is_the_loops_generation_ahead_by_at_most_the_bound() -> None:
    # generation-bound steps: async hides every update but the last behind generation
    gen, update = [10.0, 10.0, 10.0], [5.0, 5.0, 5.0]
    assert schedule(gen, update, 0)["wall_s"] == 45.0  # 10+5, three times
    assert schedule(gen, update, 1)["wall_s"] == 35.0  # 30 of generation, then the last update
    assert schedule(gen, update, 1)["train_overlapped_fraction"] == pytest.approx(10 / 15)
    # trainer-bound steps: generation waits for the update `ahead` steps back
    gen, update = [2.0] * 4, [10.0] * 4
    assert schedule(gen, update, 0)["wall_s"] == 48.0
    assert schedule(gen, update, 1)["wall_s"] == 42.0
    assert schedule(gen, update, 2)["wall_s"] == 42.0  # no faster than its trainer
    assert schedule(gen, update, 0)["train_overlapped_fraction"] == 0.0


def test_trainer_time_follows_its_stated_model() -> None:
    model = TrainerModel(flops_per_token=6e9, gpus=2, gpu_flops=1e12, mfu=0.5)
    assert model.step_s(1000) == pytest.approx(1000 * 6e9 / (2 * 1e12 * 0.5))


def test_bench_rl_async_reports_sync_and_both_async_bounds() -> None:
    done = CliRunner().invoke(app, ["bench", "rl-async", "--steps", "3", "--tasks", "4", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output.strip().splitlines()[-1])
    assert set(report["modes"]) == {"sync", "async_staleness_1", "async_staleness_2"}
    assert report["rollouts_per_step"] == 4 * 8 and report["generation_s"]["min"] > 0
    sync, one, two = (report["modes"][k] for k in report["modes"])
    assert sync["speedup_over_sync"] == 1.0
    assert two["wall_s"] <= one["wall_s"] < sync["wall_s"]
