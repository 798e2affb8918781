"""`rl.warm_start.from_run`: RL arms reuse one run's warm start, and only a warm start they could
have made themselves. The end-to-end path (a real warm start reused by an lr=0 arm through the
CLI) is in tests/trainer/test_train_smoke.py; here the checks and the copy, on config files as
written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conveyor.app.train import adopt_warm_start, warm_start_source
from conveyor.config import ConfigError, config_to_yaml, load_config

REPO = Path(__file__).resolve().parents[2]
HEADROOM = REPO / "configs" / "rl-headroom.yaml"


def _source(tmp_path: Path, *sets: str) -> Path:
    """A finished warm start's folder, as `conveyor train` leaves it (weights are bytes here)."""
    source = tmp_path / "source"
    (source / "sft_model").mkdir(parents=True)
    config = load_config(HEADROOM, [f"run.dir={source}", *sets]).config
    (source / "config.yaml").write_text(config_to_yaml(config))
    (source / "sft_model" / "model.safetensors").write_bytes(b"weights of the warm start")
    (source / "eval_after_sft.json").write_text(json.dumps({"pass_rate": 0.4, "n": 100}))
    (source / "eval_before.json").write_text(json.dumps({"pass_rate": 0.0, "n": 20}))
    (source / "sft_metrics.jsonl").write_text('{"step": 1}\n')
    return source


def _adopt(tmp_path: Path, source: Path, *sets: str) -> tuple[Path, list[str]]:
    run = tmp_path / "arm"
    run.mkdir(exist_ok=True)
    config = load_config(HEADROOM, [f"run.dir={run}", f"rl.warm_start.from_run={source}", *sets])
    said: list[str] = []
    adopt_warm_start(warm_start_source(config.config), run, said.append)
    return run, said


@pytest.mark.parametrize(
    "arm",
    [
        ["trainer.lr=0"],
        ["rl.controls.reward=shuffle"],
        ["rl.mode=async", "rl.max_staleness=2", "rl.steps=4"],
        ["trainer.train_last_layers=2", "tasks.group_size=8"],
    ],
    ids=["lr0", "shuffle", "async", "rl-blocks-and-group"],
)
def test_an_rl_arm_copies_the_warm_start_and_its_evaluations(
    tmp_path: Path, arm: list[str]
) -> None:
    source = _source(tmp_path)
    run, said = _adopt(tmp_path, source, *arm)
    assert (run / "sft_model" / "model.safetensors").read_bytes() == b"weights of the warm start"
    for name in ("eval_after_sft.json", "eval_before.json", "sft_metrics.jsonl"):
        assert (run / name).read_bytes() == (source / name).read_bytes()
    record = json.loads((run / "warm_start_from.json").read_text())
    assert record["source"] == str(source.resolve())
    assert "sft_model/" in record["copied"] and "eval_after_sft.json" in record["copied"]
    assert said == [f"warm start: reused from {source.resolve()} ({', '.join(record['copied'])})"]
    # A resumed arm already holds them: nothing is copied over its own files.
    (run / "eval_after_sft.json").write_text("{}")
    _, again = _adopt(tmp_path, source, *arm)
    assert again[0].endswith("(already here)")
    assert (run / "eval_after_sft.json").read_text() == "{}"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("trainer.seed=1", "trainer.seed: 0 there, 1 here"),
        ("rl.warm_start.lr=2.0e-4", "trainer.lr: 0.0001 there, 0.0002 here"),
        ("rl.warm_start.steps=4", "rl.warm_start.steps: 8 there, 4 here"),
        ("rl.eval.tasks=50", "rl.eval.tasks: 200 there, 50 here"),
        ("tasks.task_seed=3", "tasks.task_seed: 0 there, 3 here"),
        ("agent.max_turns=4", "agent.max_turns: 6 there, 4 here"),
        ("sampling.sampling_seed=2", "sampling.sampling_seed: None there, 2 here"),
    ],
)
def test_a_warm_start_made_otherwise_is_refused_with_the_key(
    tmp_path: Path, change: str, named: str
) -> None:
    source = _source(tmp_path)
    with pytest.raises(ConfigError) as err:
        _adopt(tmp_path, source, change)
    assert named in str(err.value)
    assert not (tmp_path / "arm" / "sft_model").exists()


def test_the_rl_blocks_count_when_the_warm_start_inherits_them(tmp_path: Path) -> None:
    # rl.warm_start.train_last_layers null: the warm start trained trainer.train_last_layers
    # blocks, so that key is now part of the warm start (in the headroom config, `all`, it is not).
    inherit = "rl.warm_start.train_last_layers=null"
    source = _source(tmp_path, inherit)
    _adopt(tmp_path, source, inherit, "trainer.lr=0")
    with pytest.raises(ConfigError, match=r"trainer\.train_last_layers: 4 there, 2 here"):
        _adopt(tmp_path, source, inherit, "trainer.train_last_layers=2")


def test_a_folder_without_a_finished_warm_start_is_refused(tmp_path: Path) -> None:
    source = _source(tmp_path)
    with pytest.raises(ConfigError, match=r"warm_start\.steps=0: there is no warm start"):
        _adopt(tmp_path, source, "rl.warm_start.steps=0")
    with pytest.raises(ConfigError, match="is not a training run folder"):
        _adopt(tmp_path, tmp_path / "nowhere")
    (source / "sft_model" / "model.safetensors").unlink()
    (source / "sft_model").rmdir()
    with pytest.raises(ConfigError, match="has no sft_model/: its warm start has not finished"):
        _adopt(tmp_path, source)
    (source / "sft_model").mkdir()
    run = tmp_path / "arm"
    run.mkdir(exist_ok=True)
    (run / "config.yaml").write_text((source / "config.yaml").read_text())
    (run / "sft_model").mkdir(exist_ok=True)
    with pytest.raises(ConfigError, match="this run's own folder"):
        _adopt(tmp_path, run)
