"""`conveyor train` is a checked plan and its phases: every refusal comes before the run folder
exists. The config's and the folders' own refusals come from `check_plan` (no part started); what
only the parts can say (the engine, the tasks) from `open_run`, which creates the folder last.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from conveyor.app.train import check_plan, run_training
from conveyor.config import ConfigError, config_to_yaml, load_config

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "filenav.yaml"
HEADROOM = REPO / "configs" / "rl-headroom.yaml"


def _train(config: Path, run: Path, *sets: str, resume: Path | None = None) -> None:
    resolved = load_config(config, [f"run.dir={run}", *sets])
    said: list[str] = []
    asyncio.run(run_training(resolved, resume=resume, say=said.append))


def _warm_start_folder(tmp_path: Path) -> Path:
    """A finished warm start's folder as `conveyor train` leaves it (weights are bytes here)."""
    source = tmp_path / "source"
    (source / "sft_model").mkdir(parents=True)
    config = load_config(HEADROOM, [f"run.dir={source}"]).config
    (source / "config.yaml").write_text(config_to_yaml(config))
    (source / "sft_model" / "model.safetensors").write_bytes(b"weights of the warm start")
    (source / "eval_after_sft.json").write_text(json.dumps({"pass_rate": 0.4, "n": 100}))
    return source


@pytest.mark.parametrize(
    ("sets", "error", "named"),
    [
        (["sampling.top_p=0.9"], ConfigError, "sampling.top_p=0.9: RL needs top_p 1"),
        (
            ["trainer.backend=tinker", "engine.kind=vllm"],
            ConfigError,
            "rl.warm_start.steps=8 with trainer.backend 'tinker'",
        ),
        (
            ["trainer.backend=tinker", "engine.kind=vllm", "rl.warm_start.steps=0"],
            ConfigError,
            "trainer.backend 'tinker' cannot train here",
        ),
        (
            ["rl.warm_start.from_run=/nowhere/at/all"],
            ConfigError,
            "is not a training run folder (no config.yaml)",
        ),
    ],
    ids=["top_p", "warm-start-on-a-service", "backend-cannot-train", "warm-start-from-nowhere"],
)
def test_a_config_that_cannot_train_is_refused_before_the_run_folder(
    tmp_path: Path, sets: list[str], error: type[Exception], named: str
) -> None:
    run = tmp_path / "run"
    with pytest.raises(error) as refused:
        _train(QUICKSTART, run, *sets)
    assert named in str(refused.value)
    assert not run.exists()


def test_a_warm_start_made_otherwise_is_refused_before_the_run_folder(tmp_path: Path) -> None:
    source = _warm_start_folder(tmp_path)
    run = tmp_path / "arm"
    with pytest.raises(ConfigError, match=r"trainer\.seed: 0 there, 1 here"):
        _train(HEADROOM, run, f"rl.warm_start.from_run={source}", "trainer.seed=1")
    assert not run.exists()


def test_a_resume_is_checked_before_anything_is_written(tmp_path: Path) -> None:
    missing = tmp_path / "no-run"
    with pytest.raises(FileNotFoundError, match="is not a training run folder"):
        _train(QUICKSTART, tmp_path / "run", resume=missing)
    assert not missing.exists() and not (tmp_path / "run").exists()
    # A run that would reuse its own folder's warm start: refused, its folder untouched.
    source = _warm_start_folder(tmp_path)
    before = sorted(p.name for p in source.rglob("*"))
    with pytest.raises(ConfigError, match="is this run's own folder"):
        _train(HEADROOM, tmp_path / "run", f"rl.warm_start.from_run={source}", resume=source)
    assert sorted(p.name for p in source.rglob("*")) == before
    assert not (tmp_path / "run").exists()


def test_a_run_dir_holding_a_run_is_refused_before_anything_starts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("rl: {}\n")
    with pytest.raises(FileExistsError, match="already holds a run"):
        _train(QUICKSTART, run, "sampling.top_p=0.9")  # refused for that first, not for top_p
    assert [p.name for p in run.iterdir()] == ["config.yaml"]


def test_an_engine_without_weight_updates_is_refused_before_the_run_folder(
    tmp_path: Path, model_dir: Path
) -> None:
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match="cannot take new weights"):
        _train(QUICKSTART, run, "engine.kind=simulated", f"model.path={model_dir}")
    assert not run.exists()


def test_too_few_training_tasks_are_refused_before_the_run_folder(
    tmp_path: Path, model_dir: Path
) -> None:
    """Once refused by the first RL step, after the evaluations and the warm start."""
    run = tmp_path / "run"
    sets = ["engine.kind=hf", f"model.path={model_dir}", "tasks.num_tasks=2"]
    with pytest.raises(ConfigError, match=r"rl\.tasks_per_step=8, but tasks\.num_tasks=2"):
        _train(QUICKSTART, run, *sets)
    assert not run.exists()


@pytest.mark.parametrize(
    ("sets", "held_out", "before"),
    [
        ([], 200, 20),
        (["rl.eval.before_tasks=null"], 200, 200),
        (["rl.eval.before_tasks=500"], 200, 200),
        (["rl.eval.tasks=0"], 0, 0),
        (["rl.eval.before_tasks=0"], 200, 0),
    ],
)
def test_the_plan_says_what_each_evaluation_covers(
    sets: list[str], held_out: int, before: int
) -> None:
    plan = check_plan(load_config(HEADROOM, sets))
    assert (plan.eval_tasks, plan.before_tasks) == (held_out, before)
    assert plan.training and plan.resume is None and plan.reused is None
    evaluation_only = check_plan(load_config(HEADROOM, ["rl.steps=0", "rl.warm_start.steps=0"]))
    assert not evaluation_only.training
