"""Tensor parallel 2 of the in-process vLLM engine on CPU (two worker processes, a core each),
and a collective weight sync into both ranks, checked by the fingerprint and against the
trainer's own forward pass.

The model is `builtin:tiny-qwen3` (conveyor.models: a random Qwen3 built from a config, no
download, the scale twin's): 4 query and 2 key/value heads of 32, which split in two (the
embedded SmolLM2's 9 heads do not), with the embedded model's tokenizer.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import torch

from conveyor.engines.base import EngineError, SampleRequest


def test_cpu_tensor_parallel_is_refused_before_loading_when_ranks_cannot_run(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conveyor.engines.memory import cpu_thread_binding
    from conveyor.engines.vllm_local import VLLMEngine, cpu_rank_binding

    folder = tmp_path / "four-heads"
    folder.mkdir()
    (folder / "config.json").write_text('{"num_attention_heads": 4, "num_key_value_heads": 2}')
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    # SmolLM2-135M: 9 attention heads do not split over 2 ranks
    with pytest.raises(EngineError, match=r"does not divide the model's 9 attention heads"):
        VLLMEngine(model_dir, tensor_parallel_size=2)
    if len(os.sched_getaffinity(0)) < 9:  # 9 ranks split its 9 heads (and 3 kv heads)
        with pytest.raises(EngineError, match=r"needs a core per rank"):
            VLLMEngine(model_dir, tensor_parallel_size=9)
    with pytest.raises(EngineError, match=r"needs a core per rank and this process may use 2"):
        cpu_thread_binding(3, [0, 1])
    with pytest.raises(EngineError, match=r"weight_sync"):
        VLLMEngine(model_dir, tensor_parallel_size=2, weight_sync="safetensors")
    cores = sorted(os.sched_getaffinity(0))
    assert cpu_rank_binding(folder, 2) == {
        "VLLM_CPU_OMP_THREADS_BIND": cpu_thread_binding(2, cores)
    }
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1|2-3")  # the user's own is kept
    assert cpu_rank_binding(folder, 2) == {}
    assert cpu_thread_binding(2, [0, 1]) == "0|1"
    assert cpu_thread_binding(2, [4, 5, 6, 7, 8]) == "4,5,6|7,8"


@pytest.mark.slow
def test_tensor_parallel_2_engine_receives_a_trained_step_by_collective_sync(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conveyor.config import TrainerConfig
    from conveyor.engines.vllm_local import VLLMEngine
    from conveyor.models import prepare_tiny_qwen3
    from conveyor.trainer.backend import TrainBatch
    from conveyor.trainer.engine import TorchTrainingEngine
    from conveyor.trainer.weight_sync import checked_sync
    from conveyor.types import TrainingSample

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    # vLLM's workers outlive its shutdown's grace period here (5 s), then get SIGTERM anyway
    monkeypatch.setenv("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "1")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    folder = prepare_tiny_qwen3()
    prompt = [11, 22, 33, 44, 55, 66]
    probe = list(range(100, 140))
    trainer = TorchTrainingEngine(
        folder,
        TrainerConfig(lr=1e-2, seed=0, device="cpu", dtype="float32", micro_batch_tokens=512),
    )
    generator = torch.Generator().manual_seed(0)
    samples = [
        TrainingSample(
            input_ids=torch.randint(0, 49152, (24,), generator=generator).tolist(),
            loss_mask=[0] * 8 + [1] * 16,
            logprobs=[0.0] * 8 + [-3.0] * 16,
            prompt_length=8,
        )
        for _ in range(4)
    ]
    trainer.step(TrainBatch(items=list(zip(samples, [1.0, -1.0, 0.5, -0.5], strict=True))))

    async def run() -> tuple[list[int], list[float], list[int], list[float], str]:
        engine = VLLMEngine(
            folder,
            tensor_parallel_size=2,
            max_model_len=256,
            max_num_seqs=2,
            kv_cache_gib=1,
            dtype="float32",
        )
        try:
            assert engine.weight_sync == "collective"  # 'auto' for tensor parallel
            # the ranks' binding was set only while they started
            assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
            request = SampleRequest(prompt_ids=prompt, max_tokens=8, temperature=0.0)
            before = await engine.sample(request)
            await checked_sync(engine, trainer, probe)(1)  # raises unless the engine serves it
            after = await engine.sample(request)
            served = await engine.weight_fingerprint(probe)
            assert served.digests and all("norm" in n for n in served.digests)
            return before.token_ids, before.logprobs, after.token_ids, after.logprobs, ""
        finally:
            await engine.close()

    ids_before, lp_before, ids_after, lp_after, _ = asyncio.run(run())
    # the trainer's own forward pass over what the engine generated: greedy picks and logprobs
    sequence = torch.tensor([prompt + ids_after])
    with torch.no_grad():
        logits = trainer.model(sequence).logits[0, len(prompt) - 1 : -1].float()
    reference = torch.log_softmax(logits, -1)
    assert reference.argmax(-1).tolist() == ids_after
    expected = reference.gather(1, torch.tensor(ids_after)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(lp_after), expected, atol=1e-4)
    assert (ids_after, lp_after) != (ids_before, lp_before)


def test_a_tensor_parallel_fingerprint_keeps_what_every_rank_holds_whole() -> None:
    from conveyor.engines.base import readable_fingerprint
    from conveyor.engines.vllm_local import replicated_fingerprint

    norm = torch.arange(4.0)
    embed = torch.arange(16.0).reshape(4, 4)
    ranks = [  # the vocabulary-parallel embedding: each rank holds its half of the rows
        readable_fingerprint([("model.norm.weight", norm), ("embed_tokens.weight", part)], 0)
        for part in embed.chunk(2)
    ]
    merged = replicated_fingerprint(ranks, 7)
    assert merged.policy_version == 7
    assert merged.digests == {"model.norm.weight": ranks[0].digests["model.norm.weight"]}
    assert merged.shapes == {"model.norm.weight": [4]}
