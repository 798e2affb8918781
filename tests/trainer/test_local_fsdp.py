"""`trainer.fsdp: true` on the built-in backend without Ray: local rank processes.

`BuiltinBackend.build` with `fsdp: true, fsdp_ranks: 2` in a process without a process group
starts two gloo ranks; their step, logprobs and exported weights equal a single process's on the
same batch, a checkpoint round-trips, and a rank that fails at load stops the others and its
error reaches the driver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_llama import random_batch, save_tiny_llama

from conveyor.config import ConveyorConfig, TrainerConfig
from conveyor.trainer.builtin import BuiltinBackend
from conveyor.trainer.engine import TorchTrainingEngine
from conveyor.trainer.local_fsdp import LocalFsdpTrainer, fsdp_ranks

SETTINGS: dict[str, Any] = {
    "lr": 1e-3,
    "micro_batch_tokens": 30,
    "device": "cpu",
    "seed": 0,
    "dtype": "float32",
}


def test_a_cpu_trainer_must_say_how_many_ranks() -> None:
    with pytest.raises(ValueError, match="fsdp_ranks"):
        fsdp_ranks(TrainerConfig(fsdp=True, **SETTINGS))
    assert fsdp_ranks(TrainerConfig(fsdp=True, fsdp_ranks=3, **SETTINGS)) == 3


@pytest.mark.slow
def test_two_local_ranks_step_like_one_process(tmp_path: Path) -> None:
    folder = save_tiny_llama(tmp_path / "tiny")
    batch = random_batch(n=7, seed=22)
    single = TorchTrainingEngine(folder, TrainerConfig(**SETTINGS))
    logprobs = single.compute_logprobs(batch.samples)
    expected = single.step(batch)
    reference = {name: t.clone() for name, t in single.export_weights()}

    settings = TrainerConfig(fsdp=True, fsdp_ranks=2, **SETTINGS)
    trainer = BuiltinBackend().build(ConveyorConfig(), folder, settings)
    assert isinstance(trainer, LocalFsdpTrainer)
    processes = list(trainer.processes)
    try:
        got = trainer.compute_logprobs(batch.samples)
        worst = max(
            abs(a - b)
            for row, want in zip(got, logprobs, strict=True)
            for a, b in zip(row, want, strict=True)
        )
        assert worst < 1e-6
        result = trainer.step(batch)
        assert result.loss == pytest.approx(expected.loss, abs=1e-6)
        assert result.grad_norm == pytest.approx(expected.grad_norm, rel=1e-5)
        assert trainer.policy_version == 1
        weights = dict(trainer.export_weights())
        assert weights.keys() == reference.keys()
        for name, tensor in reference.items():
            torch.testing.assert_close(weights[name], tensor, atol=1e-5, rtol=0)
        (tmp_path / "ckpt").mkdir()
        trainer.save(tmp_path / "ckpt")
        trainer.step(batch)
        trainer.load(tmp_path / "ckpt")
        assert trainer.policy_version == 1
        for name, tensor in trainer.export_weights():
            assert torch.equal(tensor, weights[name]), name
    finally:
        trainer.close()
    assert not any(p.is_alive() for p in processes)


@pytest.mark.slow
def test_a_rank_that_fails_to_load_stops_the_others(tmp_path: Path) -> None:
    empty = tmp_path / "no-model"
    empty.mkdir()
    with pytest.raises((OSError, ValueError), match=r"config\.json"):
        LocalFsdpTrainer.start(empty, TrainerConfig(fsdp=True, **SETTINGS), ranks=2)
