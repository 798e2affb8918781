"""Per-sample refill and the incomplete-group policy, through the real loop, dispatcher and trainer.

Rollouts sample from a real engine (the HF sampler on a tiny random Llama) and update a real
trainer. Only the runtime is simulated: its init fails deterministically for chosen (task,
sample, attempt) triples, so the dispatcher's own retries run out exactly where the test says.
"""

from __future__ import annotations

import asyncio
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest
from tiny_llama import LowHalfStages, save_tiny_llama

from conveyor.config import (
    CheckpointsConfig,
    ConveyorConfig,
    DispatchConfig,
    GroupsConfig,
    RLConfig,
    TasksConfig,
    TrainerConfig,
)
from conveyor.dispatch import DispatchSettings, make_dispatcher
from conveyor.engines.hf_local import HFEngine
from conveyor.runtime.base import RuntimeFailure
from conveyor.trainer.advantages import get_advantage
from conveyor.trainer.backend import TrainBatch
from conveyor.trainer.engine import TorchTrainingEngine
from conveyor.trainer.jsonl import read_records
from conveyor.trainer.loop import RLLoop
from conveyor.trainer.refill import refill
from conveyor.types import Status, Task, Trajectory, TrajectoryGroup

GROUP = 4
RETRIES = 1  # dispatch.max_infra_retries: attempts 0 and 1 in the first dispatch
TASKS = [Task(id=f"t{k}", family="low", prompt=[], data={"k": 10 + k}) for k in range(4)]
# (task, sample) -> attempts whose init fails. Attempt 2 is the first refill round's first.
FAILING = {
    ("t0", 1): {0, 1},  # lost to the dispatcher, refilled
    ("t1", 0): set(range(100)),  # never comes back
    ("t2", 2): {0, 1},  # two samples of one group: two refill layers, both refilled
    ("t2", 3): {0, 1},
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-refill"))


class FlakyInitStages(LowHalfStages):
    """The toy task whose runtime's init fails for the attempts `FAILING` names; every init is
    logged."""

    def __init__(self, engine: HFEngine) -> None:
        super().__init__(engine)
        self.inits: list[tuple[str, int, int]] = []

    def seed(self, task: Task, sample_index: int) -> int:
        return int(sha256(f"{task.id}/{sample_index}".encode()).hexdigest()[:8], 16)

    def score(self, low: int, total: int) -> float:
        # Never 0 for a real rollout, so a fake zero in a baseline would show.
        return (1 + low) / (1 + total)

    async def init(self, task: Task, sample_index: int, attempt: int) -> Any:
        self.inits.append((task.id, sample_index, attempt))
        if attempt in FAILING.get((task.id, sample_index), set()):
            raise RuntimeFailure(f"sandbox of {task.id}/{sample_index} died (attempt {attempt})")
        return await super().init(task, sample_index, attempt)


def run_one_step(
    tiny: Path, run_dir: Path, **groups: Any
) -> tuple[dict[str, float], TrainBatch, FlakyInitStages]:
    config = ConveyorConfig(
        rl=RLConfig(
            steps=1,
            tasks_per_step=len(TASKS),
            checkpoints=CheckpointsConfig(every=0),
            groups=GroupsConfig(**groups),
        ),
        tasks=TasksConfig(group_size=GROUP),
        dispatch=DispatchConfig(max_infra_retries=RETRIES),
        trainer=TrainerConfig(lr=1e-3, device="cpu", micro_batch_tokens=512),
    )
    backend = TorchTrainingEngine(tiny, config.trainer)
    engine = HFEngine(tiny, eos_token_id=-1)
    stages = FlakyInitStages(engine)
    run_dir.mkdir()
    loop = RLLoop(config, stages, backend, _plain_sync(backend, engine), TASKS, run_dir)
    trained: list[TrainBatch] = []
    original = backend.step

    def spy(batch: TrainBatch) -> Any:
        trained.append(batch)
        return original(batch)

    backend.step = spy  # type: ignore[method-assign]
    (record,) = asyncio.run(loop.run())
    (batch,) = trained
    return record.metrics, batch, stages


def groups_of_step(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The step's final trajectories by task, in the step's task order (the batch's order);
    the infra_error records a refill replaced are left out."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in read_records(run_dir / "rollouts.jsonl"):
        if not row.get("superseded_by_refill"):
            out.setdefault(row["task_id"], []).append(row)
    return out


def expected_advantages(groups: list[list[dict[str, Any]]]) -> list[float]:
    """GRPO over the real rewards of the given groups only: what the batch must carry."""
    estimator = get_advantage("grpo", scale_by_std=True)
    rewards = [[float(t["reward"]) for t in g] for g in groups]
    return [a for group in estimator(rewards) for a in group]


def test_refill_keeps_groups_whole_and_counts_each_outcome(tiny: Path, tmp_path: Path) -> None:
    metrics, batch, stages = run_one_step(
        tiny, tmp_path / "run", incomplete="refill", max_refills=1, refill_fallback="drop"
    )
    # Refills start at attempt 2, on the very sample that was lost; a refill has its own retries.
    refill_inits = [(t, s, a) for t, s, a in stages.inits if a >= RETRIES + 1]
    assert sorted(refill_inits) == [
        ("t0", 1, 2),
        ("t1", 0, 2),
        ("t1", 0, 3),
        ("t2", 2, 2),
        ("t2", 3, 2),
    ]
    assert metrics["filter/refill_missing"] == 4
    assert metrics["filter/refilled_samples"] == 3
    assert metrics["filter/refill_failed"] == 1  # t1/0: its group falls to the fallback, drop
    assert metrics["filter/refill_rollouts"] == 4
    assert metrics["filter/refill_rounds"] == 1
    assert metrics["filter/incomplete_groups"] == 1
    assert metrics["filter/dropped_groups"] == 1
    assert metrics["filter/partial_groups"] == 0
    assert metrics["status/infra_error"] == 1
    groups = groups_of_step(tmp_path / "run")
    for task_id in ("t0", "t2"):
        refilled = [t for t in groups[task_id] if t["counters"].get("refill_round") == 1]
        assert sorted(t["sample_index"] for t in refilled) == ([1] if task_id == "t0" else [2, 3])
    kept = [g for task_id, g in groups.items() if task_id != "t1"]
    # Whole groups only, every member a real scored rollout.
    assert all(sorted(t["sample_index"] for t in g) == [0, 1, 2, 3] for g in kept)
    assert all(t["status"] != "infra_error" and t["reward"] > 0 for g in kept for t in g)
    assert len(batch.items) == 3 * GROUP == metrics["samples"]
    assert [a for _, a in batch.items] == pytest.approx(expected_advantages(kept))
    superseded = [
        r
        for r in read_records(tmp_path / "run" / "rollouts.jsonl")
        if r.get("superseded_by_refill")
    ]
    assert len(superseded) == 4 and all(r["status"] == "infra_error" for r in superseded)


def test_refill_falls_back_to_training_the_partial_group(tiny: Path, tmp_path: Path) -> None:
    metrics, batch, _ = run_one_step(tiny, tmp_path / "run", incomplete="refill")
    assert metrics["filter/refilled_samples"] == 3 and metrics["filter/refill_failed"] == 1
    assert metrics["filter/partial_groups"] == 1 and metrics["filter/dropped_groups"] == 0
    groups = groups_of_step(tmp_path / "run")
    kept = [[t for t in g if t["status"] != "infra_error"] for g in groups.values()]
    assert [len(g) for g in kept] == [3 if k == "t1" else GROUP for k in groups]
    assert len(batch.items) == 3 * GROUP + 3
    # The short group's baseline is its three real rewards, not a fourth fake zero.
    assert [a for _, a in batch.items] == pytest.approx(expected_advantages(kept))


@pytest.mark.parametrize("policy", ["train_partial", "drop"])
def test_without_refill_short_groups_train_partial_or_drop(
    policy: str, tiny: Path, tmp_path: Path
) -> None:
    metrics, batch, stages = run_one_step(tiny, tmp_path / "run", incomplete=policy)
    assert max(a for _, _, a in stages.inits) == RETRIES  # no refill attempt
    assert metrics["filter/refill_missing"] == 0 and metrics["filter/refill_rollouts"] == 0
    assert metrics["status/infra_error"] == 4
    assert metrics["filter/incomplete_groups"] == 3
    groups = groups_of_step(tmp_path / "run")
    if policy == "train_partial":
        kept = [[t for t in g if t["status"] != "infra_error"] for g in groups.values()]
        assert metrics["filter/partial_groups"] == 3 and metrics["filter/dropped_groups"] == 0
        assert len(batch.items) == 3 + 3 + 2 + 4
    else:
        kept = [groups["t3"]]  # the only whole group
        assert metrics["filter/partial_groups"] == 0 and metrics["filter/dropped_groups"] == 3
        assert len(batch.items) == GROUP
    assert [a for _, a in batch.items] == pytest.approx(expected_advantages(kept))


class FirstTurnFlakyStages(FlakyInitStages):
    """The same stages with a first turn (as the agent's): it must reach the missing sample."""

    def __init__(self, engine: HFEngine) -> None:
        super().__init__(engine)
        self.heads: list[tuple[str, int, int]] = []
        self.runs_with_head: list[tuple[str, int]] = []

    async def first_turn(self, task: Task, sample_index: int, attempt: int) -> object:
        self.heads.append((task.id, sample_index, attempt))
        return (task.id, sample_index)

    async def run(  # type: ignore[override]
        self, task: Task, sample_index: int, runtime: Any, head: object = None
    ) -> Trajectory:
        if head is not None:
            assert head == (task.id, sample_index)
            self.runs_with_head.append((task.id, sample_index))
        return await super().run(task, sample_index, runtime)


def test_refill_keeps_the_early_first_turn_of_the_missing_sample(tiny: Path) -> None:
    stages = FirstTurnFlakyStages(HFEngine(tiny, eos_token_id=-1))
    lost = Trajectory(task_id="t0", sample_index=1, status=Status.INFRA_ERROR)
    kept = Trajectory(task_id="t0", sample_index=0, reward=0.5)
    settings = DispatchSettings(strategy="pipeline", max_infra_retries=RETRIES)
    groups, report = asyncio.run(
        refill(
            [TrajectoryGroup(task_id="t0", trajectories=[kept, lost])],
            TASKS[:1],
            stages,
            lambda s: make_dispatcher(settings, s),
            max_rounds=1,
            attempts_per_round=RETRIES + 1,
        )
    )
    assert stages.heads == [("t0", 1, 2)] and stages.runs_with_head == [("t0", 1)]
    (group,) = groups
    assert [t.sample_index for t in group.trajectories] == [0, 1]
    assert group.trajectories[1].status is Status.OK and group.trajectories[1].reward is not None
    assert report.refilled == 1 and report.superseded == [lost]


def _plain_sync(backend: Any, engine: Any) -> Any:
    """The loop's weight sync without the fingerprint check (these tests check the loop)."""

    async def sync(step: int = 0) -> float:
        await backend.sync_to(engine, step=step)
        return 0.0

    return sync
