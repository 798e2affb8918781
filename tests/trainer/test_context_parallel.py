"""Context parallelism (`trainer.context_parallel`, Ulysses attention) on two gloo ranks equals
one rank: a 4096-token sequence on a tiny random Qwen3 built from a config (no download) gives
the same logprobs (1e-5, float32), loss, gradient norm and, reduced over the ranks, the same
gradients as a single process running the whole sequence; so does a packed row of three
sequences with chunked logits and activation checkpointing. Local-only attention on the same
chunks (the wrong implementation) differs, so the check has teeth, and the engine's load probe
refuses it."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from conveyor.config import TrainerConfig
from conveyor.trainer import context_parallel
from conveyor.trainer.backend import TrainBatch
from conveyor.trainer.engine import TorchTrainingEngine
from conveyor.trainer.fsdp import full_tensor
from conveyor.types import TrainingSample

TOKENS = 4096
LOGPROB_TOL = 1e-5  # float32 (measured: 0.0, the same bits)
GRAD_TOL = 1e-5  # |got - expected| / |expected| per parameter
BASE: dict[str, Any] = {
    "lr": 1e-3,
    "micro_batch_tokens": TOKENS,
    "device": "cpu",
    "seed": 0,
    "dtype": "float32",
    "max_grad_norm": None,
}
CASES: dict[str, dict[str, Any]] = {
    "padded": {},  # one 4096-token sequence, right-padded layout, whole logits
    # three sequences in one row (1024 tokens, to keep CI time), logits in chunks, and the
    # recomputation of activation checkpointing (its attention runs again in the backward)
    "packed": {"packing": True, "logits_chunk_tokens": 300, "gradient_checkpointing": True},
}


def _batch(case: str) -> TrainBatch:
    g = torch.Generator().manual_seed(7)
    lengths = [TOKENS] if case == "padded" else [400, 300, 324]
    items = []
    for i, n in enumerate(lengths):
        # the 4k sequence's prompt covers rank 0's whole chunk: only rank 1 has trained tokens,
        # and rank 0's backward must still run (the keys it holds get gradients from rank 1)
        prompt = 2100 if case == "padded" else 96 + 10 * i
        mask = [0] * prompt + [1] * (n - prompt)
        behaviour = (-torch.rand(n, generator=g) * 5).tolist()
        sample = TrainingSample(
            input_ids=torch.randint(0, 1000, (n,), generator=g).tolist(),
            loss_mask=mask,
            logprobs=[b if m else 0.0 for b, m in zip(behaviour, mask, strict=True)],
            prompt_length=prompt,
        )
        items.append((sample, 0.7 - 0.5 * i))
    return TrainBatch(items=items)


def _run(engine: TorchTrainingEngine, batch: TrainBatch) -> dict[str, Any]:
    """Logprobs, then one step with the gradients captured just before the optimizer."""
    # the optimizer's parameters in model order (after an FSDP forward the module holds the
    # unsharded ones, so match by position, not identity)
    names = [n for n, p in engine.model.named_parameters() if p.requires_grad]
    grads: dict[str, torch.Tensor] = {}

    def capture(optimizer: Any, *_: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for name, p in zip(names, params, strict=True):
            grads[name] = full_tensor(p.grad).detach().clone()

    logprobs = engine.compute_logprobs(batch.samples)
    handle = engine.optimizer.register_step_pre_hook(capture)
    result = engine.step(batch)
    handle.remove()
    return {"logprobs": logprobs, "grads": grads, "loss": result.loss, "norm": result.grad_norm}


def _save_tiny_qwen3(folder: Path) -> Path:
    from conveyor.trainer.gpu_check import build_model

    model: Any = build_model("tiny", torch.device("cpu"), torch.float32)
    model.save_pretrained(folder)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, port: int, folder: Path, out: Path) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        results: dict[str, Any] = {}
        for case, extra in CASES.items():
            settings = TrainerConfig(fsdp=True, context_parallel=2, **BASE, **extra)
            engine = TorchTrainingEngine(folder, settings)
            batch = _batch(case)
            results[case] = _run(engine, batch)
            if case == "padded":
                # the wrong implementation: each rank attends only within its own chunk
                engine.model.set_attn_implementation("sdpa")  # type: ignore[operator]
                results[case]["local_only"] = engine.compute_logprobs(batch.samples)
        # a model whose attention ignores transformers' interface (simulated: the switch to the
        # context-parallel attention is skipped) is refused at load by the split-vs-whole probe
        original = context_parallel.use_on
        context_parallel.use_on = lambda model, cp: None  # type: ignore[assignment]
        try:
            TorchTrainingEngine(folder, TrainerConfig(fsdp=True, context_parallel=2, **BASE))
        except ValueError as error:
            results["refused"] = str(error)
        finally:
            context_parallel.use_on = original  # type: ignore[assignment]
        torch.save(results, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(
        float((torch.tensor(x) - torch.tensor(y)).abs().max()) for x, y in zip(a, b, strict=True)
    )


def test_two_context_parallel_ranks_equal_one_rank_on_4k_tokens(tmp_path: Path) -> None:
    folder = _save_tiny_qwen3(tmp_path / "tiny-qwen3")
    torch.multiprocessing.spawn(_worker, args=(_free_port(), folder, tmp_path), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for case, extra in CASES.items():
        expected = _run(TorchTrainingEngine(folder, TrainerConfig(**BASE, **extra)), _batch(case))
        if case == "padded":
            expected_padded = expected["logprobs"]
        for got in (ranks[0][case], ranks[1][case]):
            assert [len(x) for x in got["logprobs"]] == [len(x) for x in expected["logprobs"]]
            assert _max_diff(got["logprobs"], expected["logprobs"]) < LOGPROB_TOL, case
            assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-7)
            assert got["norm"] == pytest.approx(expected["norm"], rel=1e-5)
            assert got["grads"].keys() == expected["grads"].keys()
            for name, grad in expected["grads"].items():
                # relative to the gradient's own size (measured: <= 4e-7)
                error = (got["grads"][name] - grad).norm() / grad.norm()
                assert error < GRAD_TOL, (case, name, float(error))
    for got in ranks:
        assert _max_diff(got["padded"]["local_only"], expected_padded) > 1e-2
        assert "does not attend across the chunks" in got.get("refused", "not refused")


def test_split_gives_each_rank_a_chunk_with_global_positions_and_targets() -> None:
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    first, second = (context_parallel.split(ids, None, 2, r) for r in (0, 1))
    assert first.input_ids.tolist() == [[10, 11, 12]] and second.input_ids.tolist() == [[13, 14, 0]]
    assert second.position_ids.tolist() == [[3, 4, 5]]
    # each position predicts the next token of the whole row; none after the last real one
    assert first.targets.tolist() == [[11, 12, 13]] and second.valid.tolist() == [
        [True, False, False]
    ]
    packed = context_parallel.split(ids, torch.tensor([[0, 1, 2, 0, 1]]), 2, 1)
    assert packed.position_ids.tolist() == [[0, 1, 0]]  # the padding is a sequence of its own
    assert packed.segments is not None and packed.segments.tolist() == [[1, 1, 1, 2, 2, 3]]


def test_context_parallel_is_refused_without_fsdp_or_a_dividing_rank_count() -> None:
    with pytest.raises(ValueError, match=r"needs trainer\.fsdp: true"):
        TrainerConfig(context_parallel=2)
    with pytest.raises(ValueError, match=r"must divide trainer\.fsdp_ranks=3"):
        TrainerConfig(fsdp=True, fsdp_ranks=3, context_parallel=2)


def test_a_head_count_the_degree_does_not_divide_is_refused() -> None:
    from transformers import AutoModelForCausalLM, Qwen3Config

    from conveyor.trainer.gpu_check import SHAPES

    model = AutoModelForCausalLM.from_config(
        Qwen3Config(**{**SHAPES["tiny"], "num_hidden_layers": 1})
    )
    with pytest.raises(ValueError, match="has 4 \\(not a multiple of 3\\)"):
        context_parallel.use_on(model, 3)


def test_plan_divides_activations_and_logits_by_the_context_parallel_degree() -> None:
    """`conveyor plan` on the one-node GPU recipe (6 trainer GPUs): context parallel 2 halves
    each device's activations and logits, keeps the whole row's attention mask, and a degree
    that does not divide the trainer's devices is refused naming the key."""
    import json

    from typer.testing import CliRunner

    from conveyor import cli

    recipe = str(Path(__file__).resolve().parents[2] / "configs" / "swe-gpu.yaml")
    hardware = ["--nodes", "1", "--gpus-per-node", "8", "--gpu-memory-gib", "80", "--json"]

    def plan(*sets: str) -> tuple[int, dict[str, Any]]:
        args = ["plan", recipe, *hardware, *(x for s in sets for x in ("--set", s))]
        result = CliRunner().invoke(cli.app, args)
        return result.exit_code, json.loads(result.output.strip().splitlines()[-1])

    code, one = plan()
    assert code == 0 and one["trainer"]["context_parallel"] == 1
    code, two = plan("trainer.context_parallel=2")
    assert code == 0 and two["trainer"]["context_parallel"] == 2
    a, b = one["trainer"]["per_device_gib"], two["trainer"]["per_device_gib"]
    assert b["activations"] == pytest.approx(a["activations"] / 2, abs=0.01)
    assert b["logits"] == pytest.approx(a["logits"] / 2, abs=0.01)
    assert b["attention_mask"] == a["attention_mask"] and b["optimizer"] == a["optimizer"]
    code, bad = plan("trainer.context_parallel=4")
    assert code == 1 and [r["key"] for r in bad["refusals"]] == ["trainer.context_parallel"]
