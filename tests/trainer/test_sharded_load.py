"""The FSDP trainer loads shard by shard: equal to a full load, and no rank holds the whole model.

In one process, `build_on_meta` + `load_local_shards` on an unsharded model equals
`from_pretrained` (parameters, tied head, rotary buffers). On two gloo ranks with the embedded
model (SmolLM2-135M, tied embeddings): the sharded engine's gathered parameters and buffers
equal a full load exactly, its first step's loss and gradient norm equal the full-load path's
(every rank loads the whole model, then shards), and each rank's peak resident memory while the
engine loads stays below a full float32 copy plus its shard (the old path's floor). A tiny
Llama with dimensions that do not split evenly over two ranks loads exactly too.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from test_fsdp_gloo import free_port
from tiny_llama import random_batch

from conveyor.config import TrainerConfig
from conveyor.engines.base import tensor_digest
from conveyor.trainer.engine import TorchTrainingEngine
from conveyor.trainer.sharded_load import build_on_meta, load_local_shards

WORLD = 2
SETTINGS: dict[str, Any] = {
    "lr": 1e-3,
    "micro_batch_tokens": 64,
    "device": "cpu",
    "seed": 0,
    "dtype": "float32",
}


def save_uneven_llama(folder: Path) -> Path:
    """A random 2-layer Llama whose vocabulary (257), width (34) and MLP (37) are odd, so some
    of its tensors split unevenly over two ranks (FSDP pads the shorter shard)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=257,
        hidden_size=34,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def everything(model: Any) -> dict[str, torch.Tensor]:
    """The state dict (a tied head under both names) and every buffer, persistent or not."""
    return {**model.state_dict(), **dict(model.named_buffers())}


def full_state(folder: Path) -> dict[str, torch.Tensor]:
    """`everything` of `from_pretrained`."""
    from transformers import AutoModelForCausalLM

    return everything(AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32))


def test_unsharded_meta_load_equals_from_pretrained(tmp_path: Path) -> None:
    folder = save_uneven_llama(tmp_path / "tiny")
    model = build_on_meta(folder)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert all(b.device.type == "cpu" for b in model.buffers())  # rotary tables computed
    assert model.lm_head.weight is model.model.embed_tokens.weight
    load_local_shards(model, folder, torch.device("cpu"))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    got = everything(model)
    want = full_state(folder)
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_a_checkpoint_without_a_parameter_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = save_uneven_llama(tmp_path / "tiny")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.norm.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.norm\.weight"):
        load_local_shards(build_on_meta(folder), folder, torch.device("cpu"))


def test_a_sharded_load_needs_fsdp(tmp_path: Path) -> None:
    folder = save_uneven_llama(tmp_path / "tiny")
    with pytest.raises(ValueError, match="fsdp"):
        TorchTrainingEngine(folder, TrainerConfig(**SETTINGS), sharded_load=True)


def _kib(field: str) -> int:
    """A `VmRSS`/`VmHWM` line of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak() -> None:
    """Start VmHWM again from the current resident size (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def _load(folder: Path, sharded: bool) -> tuple[TorchTrainingEngine, dict[str, int]]:
    """An FSDP engine over `folder` and its load's memory: resident size before, peak during."""
    gc.collect()
    _reset_peak()
    before = _kib("VmRSS")
    engine = TorchTrainingEngine(folder, TrainerConfig(fsdp=True, **SETTINGS), sharded_load=sharded)
    return engine, {"rss_before": before, "peak": _kib("VmHWM")}


def _gathered(engine: TorchTrainingEngine) -> dict[str, str]:
    """Digests of the full (gathered) parameters and of every buffer; collective."""
    model: Any = engine.model
    digests = {name: tensor_digest(t, "float32") for name, t in engine.export_weights()}
    for name, buffer in model.named_buffers():
        digests[name] = tensor_digest(buffer, "float32")
    digests["tied"] = str(model.lm_head.weight is model.model.embed_tokens.weight)
    return digests


def worker(rank: int, port: int, model_dir: Path, tiny: Path, out: Path) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    batch = random_batch(n=3, seed=5, min_len=8, max_len=16, vocab=49152)
    report: dict[str, Any] = {}
    try:
        # the sharded path first, in a process that has not yet held a model
        engine, report["sharded"] = _load(model_dir, sharded=True)
        report["sharded_attention"] = engine.model.config._attn_implementation
        report["sharded_digests"] = _gathered(engine)
        step = engine.step(batch)
        report["sharded_step"] = [step.loss, step.grad_norm]
        del engine, step
        engine, report["full"] = _load(model_dir, sharded=False)
        report["full_attention"] = engine.model.config._attn_implementation
        step = engine.step(batch)
        report["full_step"] = [step.loss, step.grad_norm]
        del engine, step
        engine, _ = _load(tiny, sharded=True)
        report["tiny_digests"] = _gathered(engine)
    finally:
        dist.destroy_process_group()
    (out / f"rank{rank}.json").write_text(json.dumps(report))


def _digests(folder: Path) -> dict[str, str]:
    state = full_state(folder)
    return {name: tensor_digest(t, "float32") for name, t in state.items()} | {"tied": "True"}


@pytest.mark.slow
def test_two_ranks_load_their_shards_only(tmp_path: Path, model_dir: Path) -> None:
    tiny = save_uneven_llama(tmp_path / "tiny")
    torch.multiprocessing.spawn(worker, args=(free_port(), model_dir, tiny, tmp_path), nprocs=WORLD)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]

    # the whole model in float32, from its architecture's parameter count (tied head once)
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_dir)))
    full_bytes = sum(p.numel() * 4 for p in skeleton.parameters())
    bound = full_bytes + full_bytes // WORLD

    expected = _digests(model_dir)
    expected_tiny = _digests(tiny)
    for rank, report in enumerate(reports):
        assert report["sharded_digests"] == expected, f"rank {rank}"
        assert report["tiny_digests"] == expected_tiny, f"rank {rank}"
        assert report["sharded_attention"] == report["full_attention"]
        assert report["sharded_step"] == report["full_step"]  # bit for bit
        sharded = report["sharded"]["peak"] - report["sharded"]["rss_before"]
        full = report["full"]["peak"] - report["full"]["rss_before"]
        mib = 2**20
        print(
            f"rank {rank}: load peak above the process's resident size: sharded "
            f"{sharded / mib:.0f} MiB (peak {report['sharded']['peak'] / mib:.0f} MiB), full "
            f"{full / mib:.0f} MiB (peak {report['full']['peak'] / mib:.0f} MiB); bound "
            f"{bound / mib:.0f} MiB (fp32 model {full_bytes / mib:.0f} MiB + its shard)"
        )
        assert sharded < bound
        # and by a margin: a rank never held more than its shard and a transient
        assert sharded < full_bytes
