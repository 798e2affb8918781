"""The checked weight sync: a real train step, a real engine, and a sync that did not take.

The skipped syncs patch the engine's own weight loading to a no-op (its version still moves on,
so only the fingerprint can tell); that patch is the one fake here, named in each test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tiny_llama import VOCAB, LowHalfStages, random_batch, save_tiny_llama

from conveyor.config import CheckpointsConfig, ConveyorConfig, RLConfig, TasksConfig, TrainerConfig
from conveyor.engines.base import SampleRequest, WeightFingerprint
from conveyor.engines.hf_local import HFEngine
from conveyor.engines.simulated import SimulatedEngine
from conveyor.trainer.backend import FingerprintedBackend, TrainBatch
from conveyor.trainer.checkpoint import latest_checkpoint
from conveyor.trainer.engine import TorchTrainingEngine
from conveyor.trainer.loop import RLLoop, StepRecord
from conveyor.trainer.weight_sync import (
    WeightSyncError,
    check_fingerprint,
    checked_sync,
    probe_ids,
)
from conveyor.types import Task, TrainingSample

PROBE = list(range(3, 40))


def fingerprint(**overrides: Any) -> WeightFingerprint:
    values: dict[str, Any] = {
        "policy_version": 3,
        "digests": {"a": "00", "b": "11"},
        "dtypes": {"a": "float32", "b": "float32"},
        "shapes": {"a": [4], "b": [2, 2]},
        "probe_logprobs": [0.0, -1.0, -2.0],
    }
    values.update(overrides)
    return WeightFingerprint(**values)


def test_matching_fingerprints_pass_and_each_difference_is_named() -> None:
    check_fingerprint(fingerprint(), fingerprint(probe_logprobs=[0.0, -1.0001, -2.0]), 3)
    cases = {
        "policy version 2, not 3": fingerprint(policy_version=2),
        "1 of 2 digested tensors differ": fingerprint(digests={"a": "00", "b": "12"}),
        "other shapes": fingerprint(shapes={"a": [4], "b": [4]}),
        "differ by up to 0.5": fingerprint(probe_logprobs=[0.0, -1.5, -2.0]),
        "scored 2 probe tokens": fingerprint(probe_logprobs=[0.0, -1.0]),
    }
    for message, served in cases.items():
        with pytest.raises(WeightSyncError, match=message):
            check_fingerprint(served, fingerprint(), 3)
    with pytest.raises(WeightSyncError, match="nothing to compare"):
        check_fingerprint(
            fingerprint(digests={}, probe_logprobs=[]), fingerprint(probe_logprobs=[]), 3
        )


def test_probe_tolerance_follows_the_engine_dtype_unless_given() -> None:
    served = fingerprint(probe_logprobs=[0.0, -1.01, -2.0])
    with pytest.raises(WeightSyncError, match=r"tolerance 0\.0005"):
        check_fingerprint(served, fingerprint(), 3)
    check_fingerprint(served, fingerprint(), 3, tolerance=0.02)
    bf16 = {"a": "bfloat16", "b": "float32"}
    check_fingerprint(served.model_copy(update={"dtypes": bf16}), fingerprint(), 3)


def test_an_engine_without_a_fingerprint_is_refused_at_start(tmp_path: Path) -> None:
    tiny = save_tiny_llama(tmp_path)
    backend = TorchTrainingEngine(tiny, TrainerConfig(device="cpu"))
    assert isinstance(backend, FingerprintedBackend)
    with pytest.raises(WeightSyncError, match="SimulatedEngine cannot report"):
        checked_sync(SimulatedEngine(eos_token_id=0), backend, PROBE)


@pytest.mark.parametrize("lora", [False, True])
def test_checked_sync_on_hf_engine_passes_then_catches_a_load_patched_to_a_noop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lora: bool
) -> None:
    tiny = save_tiny_llama(tmp_path)
    settings = TrainerConfig(lr=1e-3, device="cpu", lora={"enabled": lora, "r": 4})
    backend = TorchTrainingEngine(tiny, settings)
    engine = HFEngine(tiny, eos_token_id=-1)
    sync = checked_sync(engine, backend, PROBE)

    async def go() -> None:
        backend.step(random_batch(vocab=VOCAB))
        await sync()
        backend.step(random_batch(seed=1, vocab=VOCAB))
        monkeypatch.setattr(engine.model, "load_state_dict", lambda *a, **k: ([], []))
        await sync()

    with pytest.raises(WeightSyncError) as caught:
        asyncio.run(go())
    message = str(caught.value)
    assert "policy version 2 did not take" in message
    # LoRA leaves embedding and norms as they were: only the probe can see the skipped load
    assert ("digested tensors differ" in message) is not lora
    assert "probe logprobs differ" in message


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_rl_loop_stops_at_a_sync_whose_load_is_patched_to_a_noop_and_never_trains_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    tiny = save_tiny_llama(tmp_path / "model")
    config = ConveyorConfig(
        rl=RLConfig(
            steps=4,
            tasks_per_step=2,
            mode=mode,  # type: ignore[arg-type]
            checkpoints=CheckpointsConfig(every=1),
        ),
        tasks=TasksConfig(group_size=4),
        trainer=TrainerConfig(lr=1e-2, device="cpu", micro_batch_tokens=256),
    )
    backend = TorchTrainingEngine(tiny, config.trainer)
    engine = HFEngine(tiny, eos_token_id=-1)
    tasks = [Task(id=f"low-{k}", family="low", prompt=[], data={"k": 10 + k}) for k in range(4)]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    loop = RLLoop(
        config, LowHalfStages(engine), backend, checked_sync(engine, backend, PROBE), tasks, run_dir
    )
    done: list[int] = []

    def after(record: StepRecord) -> None:
        done.append(record.step)
        if record.step == 2:  # from step 3 on, the engine "loads" without loading
            monkeypatch.setattr(engine.model, "load_state_dict", lambda *a, **k: ([], []))

    loop.on_step = after
    with pytest.raises(WeightSyncError, match="policy version 3 did not take"):
        asyncio.run(loop.run())
    assert done == [1, 2] and loop.step == 2
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert latest_checkpoint(run_dir) is not None
    assert latest_checkpoint(run_dir).name.endswith("2")  # type: ignore[union-attr]


# --- the real engine and the embedded model ---------------------------------------------------


@pytest.fixture(scope="module")
def vllm_engine(model_dir: Path) -> Iterator[Any]:
    from conveyor.engines.vllm_local import VLLMEngine

    engine = VLLMEngine(model_dir, max_num_seqs=4, max_model_len=1024, kv_cache_gib=1, seed=0)
    yield engine
    asyncio.run(engine.close())


def rollout_batch(engine: Any, tokenizer: Any) -> TrainBatch:
    """Four sampled answers of the engine to one question, advantages +-1."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    prompt = tokenizer.encode(text, add_special_tokens=False)

    async def answer(seed: int) -> Any:
        request = SampleRequest(prompt_ids=prompt, max_tokens=24, temperature=1.0, seed=seed)
        return await engine.sample(request)

    async def go() -> list[Any]:
        return list(await asyncio.gather(*(answer(seed) for seed in range(4))))

    items = []
    for seed, result in enumerate(asyncio.run(go())):
        sample = TrainingSample(
            input_ids=prompt + result.token_ids,
            loss_mask=[0] * len(prompt) + [1] * len(result.token_ids),
            logprobs=[0.0] * len(prompt) + result.logprobs,
            prompt_length=len(prompt),
        )
        items.append((sample, 1.0 if seed % 2 else -1.0))
    return TrainBatch(items=items)


@pytest.mark.slow
@pytest.mark.parametrize(("lora", "lr"), [(False, 1e-6), (True, 1e-5)])
def test_vllm_checked_sync_passes_after_a_real_step_and_catches_a_load_patched_to_a_noop(
    vllm_engine: Any,
    tokenizer: Any,
    model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    lora: bool,
    lr: float,
) -> None:
    settings = TrainerConfig(lr=lr, device="cpu", lora={"enabled": lora})
    backend = TorchTrainingEngine(model_dir, settings)
    probe = probe_ids(tokenizer)
    sync = checked_sync(vllm_engine, backend, probe)

    async def sync_now() -> float:
        return await sync()

    asyncio.run(sync_now())  # the engine may hold another test's weights: start level
    backend.step(rollout_batch(vllm_engine, tokenizer))
    seconds = asyncio.run(sync_now())
    assert vllm_engine.policy_version == backend.policy_version == 1
    assert seconds > 0
    # a probe right after another reads no prefix cache: the same full-length answer
    first, second = (asyncio.run(vllm_engine.weight_fingerprint(probe)) for _ in range(2))
    assert first == second and len(first.probe_logprobs) == len(probe)

    backend.step(rollout_batch(vllm_engine, tokenizer))
    runner = vllm_engine._engine.model_executor.driver_worker.worker.model_runner
    monkeypatch.setattr(runner, "reload_weights", lambda **_: None)
    with pytest.raises(WeightSyncError, match="policy version 2 did not take") as caught:
        asyncio.run(sync_now())
    # the engine believes it moved on; the fingerprint says it did not
    assert vllm_engine.policy_version == 2
    assert ("digested tensors differ" in str(caught.value)) is not lora
    assert "probe logprobs differ" in str(caught.value)


def test_the_probe_tolerance_reaches_the_check_a_loose_one_lets_a_lora_skip_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the documented blind spot, on purpose: LoRA moves no digested tensor, so with a probe
    # tolerance wider than the step moved the probe, a load patched to a no-op goes unseen
    tiny = save_tiny_llama(tmp_path)
    settings = TrainerConfig(lr=1e-3, device="cpu", lora={"enabled": True, "r": 4})
    backend = TorchTrainingEngine(tiny, settings)
    engine = HFEngine(tiny, eos_token_id=-1)
    backend.step(random_batch(vocab=VOCAB))
    monkeypatch.setattr(engine.model, "load_state_dict", lambda *a, **k: ([], []))
    loose = checked_sync(engine, backend, PROBE, tolerance=100.0)
    asyncio.run(loose())
    strict = checked_sync(engine, backend, PROBE, tolerance=1e-6)
    with pytest.raises(WeightSyncError, match=r"tolerance 1e-06"):
        asyncio.run(strict())
