"""The RL loop end to end on a tiny random Llama, sampled by the HF sampler (no vLLM).

The task is trivially learnable: a rollout earns the share of its sampled tokens that fall in
the lower half of the vocabulary. The engine is real sampling from the very weights the trainer
exports; only the task is synthetic.
"""

from __future__ import annotations

import asyncio
import json
import time
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_llama import VOCAB, LowHalfStages, save_tiny_llama

from conveyor.config import (
    CheckpointsConfig,
    ControlsConfig,
    ConveyorConfig,
    LoggingConfig,
    RLConfig,
    TasksConfig,
    TrainerConfig,
)
from conveyor.engines.hf_local import HFEngine
from conveyor.trainer.checkpoint import latest_checkpoint, load_checkpoint
from conveyor.trainer.engine import TorchTrainingEngine
from conveyor.trainer.loop import RLLoop, StepRecord
from conveyor.trainer.resume import prepare_resume
from conveyor.types import Task


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-rl"))


class PerVersionStages(LowHalfStages):
    """The toy task, seeded per task, sample and policy version."""

    def seed(self, task: Task, sample_index: int) -> int:
        key = f"{task.id}/{sample_index}/{self.engine.policy_version}".encode()
        return int(sha256(key).hexdigest()[:8], 16)


TASKS = [Task(id=f"low-{k}", family="low", prompt=[], data={"k": 10 + k}) for k in range(6)]


def make_loop(
    tiny: Path,
    run_dir: Path,
    *,
    steps: int,
    lr: float,
    mode: str = "sync",
    checkpoint_every: int = 0,
    tensorboard: bool = False,
    reward_control: str = "none",
    max_staleness: int = 1,
) -> tuple[RLLoop, TorchTrainingEngine, HFEngine]:
    config = ConveyorConfig(
        rl=RLConfig(
            steps=steps,
            tasks_per_step=4,
            mode=mode,  # type: ignore[arg-type]
            checkpoints=CheckpointsConfig(every=checkpoint_every, keep=10),
            logging=LoggingConfig(tensorboard=tensorboard),
            controls=ControlsConfig(reward=reward_control),  # type: ignore[arg-type]
            max_staleness=max_staleness,
        ),
        tasks=TasksConfig(group_size=8),
        trainer=TrainerConfig(lr=lr, device="cpu", micro_batch_tokens=512),
    )
    backend = TorchTrainingEngine(tiny, config.trainer)
    engine = HFEngine(tiny, eos_token_id=-1)
    loop = RLLoop(
        config, PerVersionStages(engine), backend, _plain_sync(backend, engine), TASKS, run_dir
    )
    return loop, backend, engine


def rewards(records: list[StepRecord]) -> list[float]:
    return [r.metrics["rollout/reward_mean"] for r in records]


def test_reward_rises_and_an_lr_zero_control_does_not(tiny: Path, tmp_path: Path) -> None:
    learn, _, _ = make_loop(tiny, tmp_path / "a", steps=14, lr=3e-2)
    (tmp_path / "a").mkdir()
    learned = rewards(asyncio.run(learn.run()))
    control, _, _ = make_loop(tiny, tmp_path / "b", steps=14, lr=0.0)
    (tmp_path / "b").mkdir()
    flat = rewards(asyncio.run(control.run()))
    first, last = sum(learned[:3]) / 3, sum(learned[-3:]) / 3
    assert last > first + 0.2, learned
    assert abs(sum(flat[-3:]) / 3 - sum(flat[:3]) / 3) < 0.15, flat
    lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(1, 15))


def test_a_shuffled_reward_control_learns_nothing_and_records_the_true_rewards(
    tiny: Path, tmp_path: Path
) -> None:
    """The random-reward arm: the same loop, learning rate and steps as the learning run of the
    test above, with the step's rewards permuted before advantages; its reward stays level."""
    control, _, _ = make_loop(tiny, tmp_path / "s", steps=14, lr=3e-2, reward_control="shuffle")
    (tmp_path / "s").mkdir()
    flat = rewards(asyncio.run(control.run()))
    assert abs(sum(flat[-3:]) / 3 - sum(flat[:3]) / 3) < 0.15, flat
    # It did update (the control is of the signal, not of the update) ...
    metrics = [json.loads(x) for x in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    assert all("train/loss" in m for m in metrics)
    # ... and rollouts.jsonl keeps what each rollout earned, the metric's mean included.
    records = [json.loads(x) for x in (tmp_path / "s" / "rollouts.jsonl").read_text().splitlines()]
    first = [r for r in records if r["step"] == 1]
    for record in first:
        (turn,) = record["turns"]
        low = sum(1 for i in turn["completion_ids"] if i < VOCAB // 2)
        assert record["reward"] == pytest.approx(low / len(turn["completion_ids"]))
    assert sum(r["reward"] for r in first) / len(first) == pytest.approx(flat[0])


def test_resume_after_a_kill_equals_the_uninterrupted_run(tiny: Path, tmp_path: Path) -> None:
    whole, whole_backend, _ = make_loop(
        tiny, tmp_path / "whole", steps=4, lr=1e-2, checkpoint_every=1
    )
    (tmp_path / "whole").mkdir()
    asyncio.run(whole.run())
    # The interrupted run: checkpoints after step 2, then "dies" after writing step 3's metrics.
    cut_dir = tmp_path / "cut"
    cut_dir.mkdir()
    first, _, _ = make_loop(tiny, cut_dir, steps=2, lr=1e-2, checkpoint_every=2)
    asyncio.run(first.run())
    with (cut_dir / "metrics.jsonl").open("a") as sink:
        sink.write(json.dumps({"step": 3, "partial": True}) + "\n")
    with (cut_dir / "rollouts.jsonl").open("a") as sink:
        sink.write('{"step": 3, "task_id": "low-')  # torn by the kill
    resumed, backend, engine = make_loop(tiny, cut_dir, steps=4, lr=1e-2, checkpoint_every=1)
    checkpoint = latest_checkpoint(cut_dir)
    assert checkpoint is not None
    extra = load_checkpoint(checkpoint, backend)
    resumed.restore(extra)
    report = prepare_resume(cut_dir, resumed.step)
    assert report.torn_lines == 1 and report.discarded_trajectories == 0
    asyncio.run(engine.update_weights(backend.export_weights(), backend.policy_version))
    asyncio.run(resumed.run())
    steps = [json.loads(x)["step"] for x in (cut_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # none repeated, none skipped
    rollouts = [
        json.loads(x)["step"] for x in (cut_dir / "rollouts.jsonl").read_text().splitlines()
    ]
    assert rollouts == [s for s in (1, 2, 3, 4) for _ in range(4 * 8)]
    a = dict(whole_backend.model.named_parameters())
    b = dict(backend.model.named_parameters())
    worst = max(float((a[n] - b[n]).detach().abs().max()) for n in a)
    assert worst <= 1e-6, worst


@pytest.mark.parametrize("bound", [1, 2])
def test_async_mode_never_trains_beyond_the_staleness_bound(
    tiny: Path, tmp_path: Path, bound: int
) -> None:
    """Generation runs up to `bound` steps ahead of training, and no further."""
    loop, backend, _ = make_loop(
        tiny, tmp_path, steps=5, lr=1e-2, mode="async", max_staleness=bound
    )
    seen: list[tuple[int, list[int]]] = []
    original = backend.step

    def spy(batch: Any) -> Any:
        version = backend.policy_version
        seen.append((version, [s.min_policy_version for s in batch.samples]))
        # An update slower than a step's generation (as on a GPU with a big batch): generation
        # is then free to run as far ahead as it may.
        time.sleep(1.0)
        return original(batch)

    backend.step = spy  # type: ignore[method-assign]
    records = asyncio.run(loop.run())
    assert len(records) == 5 and len(seen) == 5
    for version, oldest in seen:
        assert all(version - v <= bound for v in oldest)
    # Overlap really happened: some step trained on data generated `bound` versions before.
    assert any(version - v == bound for version, oldest in seen for v in oldest)
    assert all(r.metrics["staleness/dropped_samples"] == 0 for r in records)
    # each step's tasks are the next in the stream, whatever ran ahead
    assert [r.metrics["data/cursor"] for r in records] == [4.0 * k for k in range(1, 6)]
    assert torch.isfinite(torch.tensor([r.metrics["train/loss"] for r in records])).all()


def test_metrics_also_go_to_tensorboard_when_asked(tiny: Path, tmp_path: Path) -> None:
    loop, _, _ = make_loop(tiny, tmp_path, steps=2, lr=1e-2, tensorboard=True)
    asyncio.run(loop.run())
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def _plain_sync(backend: Any, engine: Any) -> Any:
    """The loop's weight sync without the fingerprint check (these tests check the loop)."""

    async def sync(step: int = 0) -> float:
        await backend.sync_to(engine, step=step)
        return 0.0

    return sync


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failed_collection_stops_the_loop_with_its_error(
    tiny: Path, tmp_path: Path, mode: str
) -> None:
    """Generation runs in its own task: its failure (an engine down for good) still ends the
    run with that error, after the steps before it, in either mode."""
    loop, _, _ = make_loop(tiny, tmp_path, steps=4, lr=1e-2, mode=mode)
    original = loop.collect

    async def collect(tasks: Any, step: int) -> Any:
        if step == 3:
            raise RuntimeError("engine down for good")
        return await original(tasks, step)

    loop.collect = collect  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="engine down for good"):
        asyncio.run(loop.run())
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
