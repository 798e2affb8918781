"""FSDP2 over two CPU processes (gloo): one step equals a single-process step on the full batch.

Both ranks get the same full batch; each runs its share of the micro-batches (one rank also runs
an empty pass so the collective counts match). Afterwards both ranks export identical full
weights equal to the single-process run's, and a checkpoint saved collectively loads back into
a fresh sharded engine unchanged.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_llama import random_batch, save_tiny_llama

from conveyor.config import TrainerConfig
from conveyor.trainer.batching import assign_to_ranks, plan_micro_batches
from conveyor.trainer.engine import TorchTrainingEngine

WORLD = 2
SETTINGS: dict[str, Any] = {"lr": 1e-3, "micro_batch_tokens": 30, "device": "cpu", "seed": 0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(rank: int, port: int, folder: Path, out: Path) -> None:
    import torch.distributed as dist

    from conveyor.trainer.checkpoint import load_checkpoint, save_checkpoint

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        engine = TorchTrainingEngine(folder, TrainerConfig(fsdp=True, **SETTINGS))
        result = engine.step(random_batch(n=7, seed=22))
        weights = {name: t.clone() for name, t in engine.export_weights()}
        saved = save_checkpoint(out / "run", 1, engine, extra={"rank_agnostic": True})
        fresh = TorchTrainingEngine(folder, TrainerConfig(fsdp=True, **SETTINGS))
        extra = load_checkpoint(saved, fresh)
        reloaded = {name: t.clone() for name, t in fresh.export_weights()}
        torch.save(
            {
                "weights": weights,
                "reloaded": reloaded,
                "loss": result.loss,
                "grad_norm": result.grad_norm,
                "extra": extra,
                "version": fresh.policy_version,
            },
            out / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_rank_fsdp_step_equals_a_single_process_step(tmp_path: Path) -> None:
    folder = save_tiny_llama(tmp_path / "tiny")
    batch = random_batch(n=7, seed=22)
    plan = plan_micro_batches(
        [len(s.input_ids) for s in batch.samples], SETTINGS["micro_batch_tokens"]
    )
    ranks = assign_to_ranks(plan, WORLD)
    assert len(ranks[0]) != len(ranks[1])  # the test covers the empty padding pass

    single = TorchTrainingEngine(folder, TrainerConfig(**SETTINGS))
    expected = single.step(batch)
    reference = dict(single.export_weights())

    torch.multiprocessing.spawn(worker, args=(free_port(), folder, tmp_path), nprocs=WORLD)

    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    for result in results:
        assert result["loss"] == pytest.approx(expected.loss, abs=1e-6)
        # Adam hides a gradient scale error in the weights; the norm does not
        assert result["grad_norm"] == pytest.approx(expected.grad_norm, rel=1e-5)
        assert result["weights"].keys() == reference.keys()
        for name, tensor in reference.items():
            torch.testing.assert_close(result["weights"][name], tensor, atol=1e-5, rtol=0)
            assert torch.equal(result["weights"][name], results[0]["weights"][name])
            assert torch.equal(result["reloaded"][name], result["weights"][name])
        assert result["extra"] == {"rank_agnostic": True}
        assert result["version"] == 1


# float32: under bf16 autocast (dtype auto on a CPU with AVX512-BF16) the layouts round
# differently (grad norms 4e-5 apart on one process already)
FLOAT32: dict[str, Any] = {**SETTINGS, "dtype": "float32"}
# Packing and chunked logits together on two data-parallel ranks. Each alone under FSDP is no
# longer a case of its own (two rank spawns, ~30 s of CI): each alone equals the padded
# whole-logits step in one process (test_engine_layouts.py), this case runs both under FSDP at
# dp 2, and the scale twin (tests/app/test_scale_twin.py) both with context parallel 2 through
# `conveyor train`.
LAYOUTS: dict[str, dict[str, Any]] = {
    "packed_chunked": {"packing": True, "logits_chunk_tokens": 6},
}


def layout_worker(rank: int, port: int, folder: Path, out: Path, layout: str) -> None:
    """One packed, chunked-logits step of a two-rank FSDP engine; results to rank{r}.pt."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        engine = TorchTrainingEngine(folder, TrainerConfig(fsdp=True, **FLOAT32, **LAYOUTS[layout]))
        batch = random_batch(n=7, seed=22)
        logprobs = engine.compute_logprobs(batch.samples)
        result = engine.step(batch)
        weights = {name: t.clone() for name, t in engine.export_weights()}
        torch.save(
            {
                "weights": weights,
                "logprobs": logprobs,
                "loss": result.loss,
                "grad_norm": result.grad_norm,
            },
            out / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fsdp_packed_chunked_step_equals_a_single_process_padded_step(
    tmp_path: Path, layout: str
) -> None:
    """Under FSDP2 the LM head's weight is gathered by the root unit's forward: the chunked
    head reads it after the forward, and its gradient reaches the sharded parameter."""
    folder = save_tiny_llama(tmp_path / "tiny")
    batch = random_batch(n=7, seed=22)
    single = TorchTrainingEngine(folder, TrainerConfig(**FLOAT32))
    logprobs = single.compute_logprobs(batch.samples)
    expected = single.step(batch)
    reference = dict(single.export_weights())

    torch.multiprocessing.spawn(
        layout_worker, args=(free_port(), folder, tmp_path, layout), nprocs=WORLD
    )

    for rank in range(WORLD):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        worst = max(
            abs(a - b)
            for got, want in zip(result["logprobs"], logprobs, strict=True)
            for a, b in zip(got, want, strict=True)
        )
        assert worst < 1e-6
        assert result["loss"] == pytest.approx(expected.loss, abs=1e-6)
        assert result["grad_norm"] == pytest.approx(expected.grad_norm, rel=1e-5)
        for name, tensor in reference.items():
            torch.testing.assert_close(result["weights"][name], tensor, atol=1e-5, rtol=0)
