"""Checkpoints resume exactly, are written atomically, and are pruned to the newest N."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tiny_llama import random_batch, save_tiny_llama

from conveyor.config import TrainerConfig
from conveyor.trainer import checkpoint
from conveyor.trainer.backend import TrainBatch
from conveyor.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from conveyor.trainer.engine import TorchTrainingEngine

SETTINGS: dict[str, dict[str, Any]] = {
    "full": {"lr": 1e-3, "warmup_steps": 1, "schedule": "cosine"},
    # LoRA dropout draws from torch's RNG: resuming exactly needs the RNG state restored too
    "lora": {"lr": 1e-2, "lora": {"enabled": True, "r": 4, "dropout": 0.2}},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def engine(folder: Path, kind: str) -> TorchTrainingEngine:
    return TorchTrainingEngine(
        folder, TrainerConfig(device="cpu", micro_batch_tokens=40, **SETTINGS[kind]), total_steps=3
    )


def batches() -> list[TrainBatch]:
    return [random_batch(n=4, seed=10 + k) for k in range(3)]


def params(e: TorchTrainingEngine) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in e.model.named_parameters()}


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_resume_from_step_2_equals_the_uninterrupted_run(
    tiny: Path, tmp_path: Path, kind: str
) -> None:
    data = batches()
    uninterrupted = engine(tiny, kind)
    for batch in data:
        uninterrupted.step(batch)

    first = engine(tiny, kind)
    for batch in data[:2]:
        first.step(batch)
    saved = save_checkpoint(tmp_path, 2, first, extra={"cursor": 8, "step": 2})
    assert saved == latest_checkpoint(tmp_path)
    assert (saved / ("adapter.safetensors" if kind == "lora" else "model.safetensors")).is_file()
    random.random(), np.random.rand(), torch.rand(3)  # the interruption moves every RNG on
    del first

    resumed = engine(tiny, kind)
    extra = load_checkpoint(saved, resumed)
    assert extra == {"cursor": 8, "step": 2}
    assert resumed.policy_version == 2
    result = resumed.step(data[2])
    assert result.policy_version == 3
    a, b = params(uninterrupted), params(resumed)
    worst = max((a[n] - b[n]).abs().max().item() for n in a)
    assert worst <= 1e-6


def test_rng_states_round_trip() -> None:
    state = checkpoint.capture_rng_state()
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    json.loads(json.dumps(state))  # JSON-able
    checkpoint.restore_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_crash_mid_write_leaves_the_previous_checkpoint_loadable(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engine(tiny, "full")
    e.step(batches()[0])
    good = save_checkpoint(tmp_path, 1, e, extra={"step": 1})
    expected = params(e)
    e.step(batches()[1])

    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full (simulated)")

    # the weights are written, then the optimizer write dies
    monkeypatch.setattr(checkpoint.torch, "save", crash)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(tmp_path, 2, e, extra={"step": 2})
    monkeypatch.undo()

    assert latest_checkpoint(tmp_path) == good
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [good.name]
    fresh = engine(tiny, "full")
    assert load_checkpoint(good, fresh) == {"step": 1}
    assert all(torch.equal(expected[n], p) for n, p in params(fresh).items())


def test_a_stale_temp_folder_and_a_resaved_step_are_handled(tiny: Path, tmp_path: Path) -> None:
    e = engine(tiny, "full")
    stale = checkpoint.checkpoint_dir(tmp_path, 1).with_name(".tmp-step_000001")
    stale.mkdir(parents=True)
    (stale / "junk").write_text("left by kill -9")
    assert latest_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path, 1, e, extra={"try": 1})
    save_checkpoint(tmp_path, 1, e, extra={"try": 2})  # the same step again replaces it
    path = latest_checkpoint(tmp_path)
    assert path is not None
    assert json.loads((path / "extra.json").read_text()) == {"try": 2}
    assert not (path / "junk").exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]


def test_keep_last_prunes_old_checkpoints(tiny: Path, tmp_path: Path) -> None:
    e = engine(tiny, "full")
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, e, keep_last=2)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [3, 4]
    with pytest.raises(FileNotFoundError, match="complete"):
        load_checkpoint(tmp_path / "checkpoints", e)


def test_loading_an_adapter_checkpoint_into_a_full_engine_is_an_error(
    tiny: Path, tmp_path: Path
) -> None:
    path = save_checkpoint(tmp_path, 1, engine(tiny, "lora"))
    with pytest.raises(FileNotFoundError, match="lora"):
        load_checkpoint(path, engine(tiny, "full"))
