"""The Ray executor: same statuses and counts as asyncio on the same seeded workload."""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections import Counter
from pathlib import Path

import pytest

from conveyor.config.base import PartChoice
from conveyor.dispatch import DispatchSettings, make_dispatcher
from conveyor.dispatch.executors import AsyncioExecutor, Executor, make_executor
from conveyor.registry import UnknownName
from conveyor.runtime.base import Runtime
from conveyor.sim.engine import SimEngine
from conveyor.sim.stages import SimEnvironment
from conveyor.sim.swe import SweSimWorkload
from conveyor.types import Task, Trajectory

# Real time (Ray answers from other processes), so every duration is scaled down.
FAST = SweSimWorkload(
    tasks=5,
    samples_per_task=3,
    turns_min=2,
    turns_max=4,
    prompt_tokens=50,
    completion_median_tokens=10,
    completion_max_tokens=20,
    observation_median_tokens=20,
    init_median_s=0.05,
    reward_median_s=0.03,
    tool_median_s=0.01,
    tool_sigma=0.3,
    step_base_s=0.0005,
    max_live_runtimes=6,
    cpu_slots=4,
    init_failure_rate=0.2,
    tool_hang_rate=0.05,
    reward_failure_rate=0.05,
)


# rollouts whose first turn ran beside init, per executor kind (both must start some)
FIRST_TURNS: dict[str, int] = {}


async def _statuses(executor: Executor, seed: int) -> Counter[tuple[str, int, str, int]]:
    engine = SimEngine(FAST, occupancy_reference=4)
    engine.start()
    env = SimEnvironment(FAST, seed, engine)
    settings = DispatchSettings(
        strategy="pipeline",
        p_init=4,
        p_run=6,
        p_reward=4,
        max_live_runtimes=6,
        run_timeout_s=8.0,
        max_infra_retries=2,
    )
    dispatcher = make_dispatcher(settings, env, executor=executor, engine=engine)
    records = [t async for t in dispatcher.rollouts(env.tasks(), FAST.samples_per_task)]
    out = Counter(
        (t.task_id, t.sample_index, str(t.status), t.counters["infra_retries"]) for t in records
    )
    FIRST_TURNS[type(executor).__name__] = sum("head_start" in t.timings for t in records)
    await engine.close()
    assert dispatcher.peak_live_runtimes <= 6
    return out


@functools.cache
def _asyncio_statuses(seed: int) -> Counter[tuple[str, int, str, int]]:
    """`_statuses` on the asyncio executor: the reference every Ray placement below is held to,
    run once per seed (the same seeded workload gives the same statuses; the tests assert it)."""
    return asyncio.run(_statuses(AsyncioExecutor(), seed))


class _WhereStages:
    """Records the process each stage's runtime work happens in."""

    async def init(self, task: Task, sample_index: int, attempt: int) -> Runtime:
        clean = FAST.model_copy(update={"init_failure_rate": 0.0})
        runtime = await SimEnvironment(clean, 0).init(task, sample_index, 0)
        runtime.init_pid = os.getpid()  # type: ignore[attr-defined]
        return runtime

    async def run(self, task: Task, sample_index: int, runtime: Runtime) -> Trajectory:
        result = await runtime.exec("sleep 0.001", 5)
        return Trajectory(
            task_id=task.id,
            sample_index=sample_index,
            metrics={"driver_pid": float(os.getpid()), "tool_ok": float(result.exit_code == 0)},
        )

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Trajectory:
        pid = float(os.getpid())
        init_pid = float(runtime.init_pid)  # type: ignore[attr-defined]
        return trajectory.model_copy(
            update={
                "reward": 1.0,
                "metrics": {**trajectory.metrics, "reward_pid": pid, "init_pid": init_pid},
            }
        )


def _worker_path(here: str) -> str:
    """PYTHONPATH for Ray workers: this folder, then the driver's own (which may put a checkout's
    sources before the installed package)."""
    return os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)


@pytest.mark.slow
def test_ray_executor_matches_asyncio() -> None:
    ray = pytest.importorskip("ray")
    from conveyor.dispatch.ray_executor import RayExecutor

    here = str(Path(__file__).parent)  # actors unpickle `_WhereStages` from this module
    ray.init(
        num_cpus=2,
        resources={"sandbox": 6},
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": _worker_path(here)}},
    )
    try:
        seed = 4
        local = _asyncio_statuses(seed)
        remote = asyncio.run(_statuses(RayExecutor(resources={"sandbox": 1}), seed))
        assert sum(local.values()) == FAST.trajectories
        assert remote == local
        # the pipeline started first turns beside inits on both (Ray: in this process)
        assert FIRST_TURNS["AsyncioExecutor"] > 0 and FIRST_TURNS["RayExecutor"] > 0
        statuses = Counter(key[2] for key in local.elements())
        assert len(statuses) >= 2  # faults really happened

        async def where() -> list[Trajectory]:
            dispatcher = make_dispatcher(
                DispatchSettings(strategy="bounded_batch"), _WhereStages(), executor=RayExecutor()
            )
            return [t async for t in dispatcher.rollouts(SimEnvironment(FAST, 0).tasks(2), 2)]

        placed = asyncio.run(where())
        assert [t.error for t in placed] == [None] * 4
        for trajectory in placed:
            metrics = trajectory.metrics
            assert metrics["tool_ok"] == 1.0
            assert metrics["init_pid"] == metrics["reward_pid"]  # same actor for every stage
            assert metrics["reward_pid"] != metrics["driver_pid"]  # ... and not this process
        for _ in range(100):  # ray.kill is asynchronous: give the last actors a moment
            if ray.available_resources().get("sandbox") == 6:
                break
            time.sleep(0.1)
        assert ray.available_resources().get("sandbox") == 6  # every actor released
    finally:
        ray.shutdown()


def test_ray_executor_without_ray_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from conveyor.dispatch import ray_executor

    real_import = builtins.__import__

    def no_ray(name: str, *args: object, **kwargs: object) -> object:
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ImportError, match=r"pip install 'conveyor\[ray\]'"):
        ray_executor.RayExecutor().place(SimEnvironment(FAST, 0))


class _NodeStages(_WhereStages):
    """Flags a rollout whose init or reward did not run on the `expected` Ray node."""

    def __init__(self, expected: str) -> None:
        self.expected = expected

    async def init(self, task: Task, sample_index: int, attempt: int) -> Runtime:
        import ray

        runtime = await super().init(task, sample_index, attempt)
        runtime.init_node = ray.get_runtime_context().get_node_id()  # type: ignore[attr-defined]
        return runtime

    async def reward(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Trajectory:
        import ray

        scored = await super().reward(task, trajectory, runtime)
        node = ray.get_runtime_context().get_node_id()
        init_node = runtime.init_node  # type: ignore[attr-defined]
        ok = node == init_node == self.expected
        return scored.model_copy(update={"error": None if ok else f"{init_node} -> {node}"})


@pytest.mark.slow
def test_ray_executor_on_a_simulated_two_node_cluster() -> None:
    """`ray.cluster_utils.Cluster`: a head without sandboxes and a worker node that has them.
    Every runtime actor is placed on the worker by its `{"sandbox": 1}` request, every stage of
    a rollout reaches that actor there, and statuses and counts equal asyncio's."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from conveyor.dispatch.ray_executor import RayExecutor

    here = str(Path(__file__).parent)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    worker = cluster.add_node(num_cpus=1, resources={"sandbox": 6})
    try:
        ray.init(
            address=cluster.address,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": _worker_path(here)}},
        )
        cluster.wait_for_nodes()
        seed = 4
        local = _asyncio_statuses(seed)
        remote = asyncio.run(_statuses(RayExecutor(resources={"sandbox": 1}), seed))
        assert remote == local and sum(remote.values()) == FAST.trajectories

        async def where() -> list[Trajectory]:
            dispatcher = make_dispatcher(
                DispatchSettings(strategy="bounded_batch"),
                _NodeStages(worker.node_id),
                executor=RayExecutor(resources={"sandbox": 1}),
            )
            return [t async for t in dispatcher.rollouts(SimEnvironment(FAST, 0).tasks(2), 2)]

        placed = asyncio.run(where())
        assert len(placed) == 4
        for trajectory in placed:
            assert trajectory.error is None  # init and reward ran on the sandbox node
            assert trajectory.metrics["tool_ok"] == 1.0
        assert worker.node_id != ray.get_runtime_context().get_node_id()
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_executors_are_chosen_by_name() -> None:
    """`dispatch.executor` names (a `PartChoice`): `asyncio` runs a dispatch here, `ray` is
    built without importing Ray (it starts on first use), a typo names the nearest."""
    executor = make_executor(PartChoice(name="asyncio"))
    assert isinstance(executor, AsyncioExecutor)

    async def tiny() -> list[Trajectory]:
        settings = DispatchSettings(strategy="bounded_batch")
        dispatcher = make_dispatcher(settings, _WhereStages(), executor=executor)
        return [t async for t in dispatcher.rollouts(SimEnvironment(FAST, 0).tasks(2), 2)]

    done = asyncio.run(tiny())
    assert [t.error for t in done] == [None] * 4
    for trajectory in done:  # every stage ran in this process
        metrics = trajectory.metrics
        assert metrics["init_pid"] == metrics["reward_pid"] == metrics["driver_pid"] == os.getpid()
    from conveyor.dispatch.ray_executor import RayExecutor

    assert isinstance(make_executor(PartChoice(name="ray")), RayExecutor)
    with pytest.raises(UnknownName, match=r"unknown dispatch executor 'rayy'.*'ray'\?"):
        make_executor(PartChoice(name="rayy"))


@pytest.mark.slow
def test_the_executor_named_ray_starts_a_local_ray_that_can_place_its_runtimes() -> None:
    """No cluster and no `ray.init` before: the executor `ray` starts a local Ray that offers
    the `sandbox` resource its actors ask for (else they would wait forever), and a dispatch
    on it ends exactly as on asyncio."""
    ray = pytest.importorskip("ray")
    from conveyor.dispatch.ray_executor import LOCAL_RESOURCE_UNITS

    assert not ray.is_initialized()
    try:
        remote = asyncio.run(_statuses(make_executor(PartChoice(name="ray")), seed=4))
        assert ray.cluster_resources().get("sandbox") == LOCAL_RESOURCE_UNITS
    finally:
        ray.shutdown()
    assert remote == _asyncio_statuses(4)
