"""A run on a Ray cluster (`cluster:` and `trainer.backend: ray_fsdp`, docs/scale.md).

Fast: the settings that cannot work together, and an unreachable address, each answered with one
message in seconds (through `conveyor eval`, before any engine starts). Slow: a simulated
four-node `ray.cluster_utils.Cluster` runs two real RL steps of the quickstart model and then an
evaluation, and a cluster without a sandbox or engine node is refused at start.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from run_records import records, rollouts

from conveyor.config import ConfigError, load_config
from conveyor.config.cluster import ClusterConfig
from conveyor.dispatch.ray_cluster import ClusterError, connect, head_endpoint

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.backend=ray_fsdp"],
            r"trainer.backend 'ray_fsdp' runs the trainer as Ray actors, but cluster.address "
            r"is null",
        ),
        (
            ["cluster.address=local", "cluster.trainer_workers=2"],
            r"cluster.trainer_workers \(2\) needs trainer.backend 'ray_fsdp'",
        ),
        (
            ["cluster.address=local", "dispatch.executor=ray"],
            r"dispatch.executor 'ray' with cluster.address set.*leave dispatch.executor at "
            r"'asyncio'",
        ),
        (["cluster.sandbox_resource=CPU"], r"'CPU' is one of Ray's own resources"),
        (
            ["cluster.engine_resource=engine"],
            r"cluster.engine_resource 'engine' places engine replicas on a Ray cluster, but "
            r"cluster.address is null",
        ),
        (
            [
                "cluster.address=local",
                "cluster.engine_resource=engine",
                "engine.kind=openai",
                "engine.base_url=http://a/v1",
            ],
            r"cluster.engine_resource starts vLLM servers on the cluster, which needs "
            r"engine.kind 'vllm', not 'openai'",
        ),
        (["cluster.engine_resource=GPU"], r"'GPU' is one of Ray's own resources"),
        (["cluster.trainer_workers=0"], r"cluster.trainer_workers"),
    ],
)
def test_cluster_settings_that_cannot_work_together_are_refused(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "configs/filenav.yaml", overrides)


def test_a_cluster_run_is_one_section_and_one_backend_name() -> None:
    resolved = load_config(
        REPO / "configs/filenav.yaml",
        [
            "cluster.address=ray://head:10001",
            "trainer.backend=ray_fsdp",
            "cluster.trainer_workers=4",
        ],
    )
    cluster = resolved.config.cluster
    assert (cluster.address, cluster.trainer_workers) == ("ray://head:10001", 4)
    assert (cluster.sandbox_resource, cluster.trainer_resource) == ("sandbox", "trainer")
    assert resolved.sources["cluster.address"] == "--set"
    assert load_config(REPO / "configs/filenav.yaml").config.cluster.address is None


def test_cluster_addresses_name_the_head_they_probe() -> None:
    assert head_endpoint("10.0.0.5:6380") == ("10.0.0.5", 6380)
    assert head_endpoint("head") == ("head", 6379)
    assert head_endpoint("ray://head") == ("head", 10001)
    assert head_endpoint("ray://10.0.0.5:10002") == ("10.0.0.5", 10002)
    assert head_endpoint("[fd00::2]:6379") == ("fd00::2", 6379)
    assert head_endpoint("auto") is None
    with pytest.raises(ClusterError, match="is not HOST:PORT"):
        head_endpoint("head:port")


def test_an_unreachable_address_is_one_message_in_seconds(tmp_path: Path) -> None:
    """Ray's own `ray.init` retries an unreachable head for minutes (measured: still waiting
    after 120 s); the probe answers at once, and `conveyor eval` stops before the engine starts
    and before a run folder exists."""
    pytest.importorskip("ray")
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ClusterError, match=rf"'{address}': nothing answers at 127.0.0.1"):
        connect(ClusterConfig(address=address, connect_timeout_s=5))
    assert time.monotonic() - started < 6

    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor.cli",
            "eval",
            str(REPO / "configs/quickstart-eval.yaml"),
            "--set",
            f"cluster.address={address}",
            "--set",
            f"run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = [row for row in result.stderr.splitlines() if row.strip()]
    assert line.startswith(f"error: cluster.address '{address}': nothing answers")
    assert "ray start --head" in line
    assert time.monotonic() - started < 60  # interpreter start and imports; no engine
    assert not run_dir.exists()


def conveyor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        env=env,
    )


def actor_table(address: str) -> list[dict[str, Any]]:
    """Every actor Ray's actor table (GCS) knows of, dead ones included, read as a new driver."""
    import ray
    from ray._private.state import actors

    ray.init(address=address, log_to_driver=False)
    try:
        return list(actors().values())
    finally:
        ray.shutdown()


def live(table: list[dict[str, Any]]) -> list[str]:
    return [a["ActorClassName"] for a in table if a["State"] != "DEAD"]


@pytest.mark.slow
def test_a_cluster_without_a_sandbox_node_is_refused_at_start(tmp_path: Path) -> None:
    """Head and one trainer node, no node with `sandbox` nor `engine`: `conveyor train` says
    so, with the trainer and CPU shortfalls, before the engine starts; nothing is left running
    on the cluster."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1, resources={"trainer": 2})
        cluster.wait_for_nodes()
        run_dir = tmp_path / "run"
        started = time.monotonic()
        result = conveyor(
            "train",
            "configs/filenav.yaml",
            *("--set", f"cluster.address={cluster.address}"),
            *("--set", "trainer.backend=ray_fsdp"),
            *("--set", "cluster.trainer_workers=3"),
            *("--set", "cluster.engine_resource=engine"),
            *("--set", "cluster.engine_cpus_per_replica=2"),
            *("--set", f"run.dir={run_dir}"),
        )
        elapsed = time.monotonic() - started
        assert result.returncode == 2, result.stderr[-3000:]
        errors = [row for row in result.stderr.splitlines() if row.startswith("error:")]
        assert len(errors) == 1, result.stderr[-3000:]
        assert "cannot host this run: no node offers the resource 'sandbox'" in errors[0]
        assert "cluster.trainer_workers is 3 but the nodes offer 2 units of 'trainer'" in errors[0]
        # the engine replica's CPUs and the trainer workers' together
        assert (
            "1 engine replicas x cluster.engine_cpus_per_replica 2 + 3 trainer workers x "
            "cluster.trainer_cpus_per_worker 1 = 5 CPUs, but the cluster has 2" in errors[0]
        )
        assert "engine.replicas is 1 but the nodes offer 0 units of 'engine'" in errors[0]
        assert "trainer: 2" in errors[0]  # the nodes it saw
        assert elapsed < 90 and not run_dir.exists()
        assert live(actor_table(cluster.address)) == []
    finally:
        cluster.shutdown()


# Two RL steps of the quickstart model on tasks graded in bubblewrap sandboxes, with reward
# variance from the untrained model (the `mention` plugin family: say a word; `grep -w` in the
# rollout's sandbox decides). Seeded sampling (`sampling_seed`: one seed per request, from the
# rollout and turn) makes the rollouts of both runs the same tokens.
TWO_STEPS = [
    "plugins=[mention_family]",
    "tasks.families=[mention]",
    "tasks.num_tasks=4",
    "tasks.group_size=2",
    "rl.tasks_per_step=4",
    "rl.steps=2",
    # no in-run evaluations: the `conveyor eval` on the same cluster below places its runtimes
    # on the sandbox node (four more greedy passes here cost ~30 s of CI for no other check)
    "rl.eval.tasks=0",
    "rl.warm_start.steps=0",
    "rl.checkpoints.every=2",
    "agent.max_turns=2",
    "agent.max_completion_tokens=48",
    "sampling.sampling_seed=3",
    "trainer.lr=1.0e-4",  # moves weights well past the comparison's tolerance
    # float32 on every CPU: with `auto`, a CPU with AVX512-BF16 autocasts to bf16, and two FSDP
    # ranks summing bf16 gradients differ from one process by ~1e-4 (grad norm, measured)
    "trainer.dtype=float32",
]
ROLLOUTS = 2 * 4 * 2  # steps x tasks x group size
WEIGHT_TOLERANCE = 1e-5
OBJECT_STORE_BYTES = 1536 * 1024**2  # the float32 weights (0.54 GB) with room for the batch


def train(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    sets = [*TWO_STEPS, f"run.dir={run_dir}", *extra]
    return conveyor(
        "train",
        "configs/filenav.yaml",
        *[arg for item in sets for arg in ("--set", item)],
    )


@pytest.mark.slow
def test_two_rl_steps_on_a_four_node_cluster_equal_a_single_process_run(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Head, a `sandbox`, a `trainer` and an `engine` node (`ray.cluster_utils.Cluster`, CPU
    only): `conveyor train` with `cluster.address` and `trainer.backend: ray_fsdp` places every
    runtime (bubblewrap) on the sandbox node and two FSDP2 workers (gloo) on the trainer node;
    the engine is in-process vLLM in the driver. Rollouts, losses and final weights equal a run
    of the same config in one process. Then `conveyor eval`, unchanged, on the same cluster with
    `cluster.engine_resource`: its engine is a vLLM server that an actor on the engine node
    starts, its runtimes on the sandbox node. No actor and no server outlives its run."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    from safetensors.torch import load_file

    # Every Ray worker (started by the nodes below) imports the plugin family too.
    plugins = str(REPO / "tests/plugins/parts")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([plugins, os.environ.get("PYTHONPATH", "")]))
    # Ray's memory monitor kills workers when the whole machine passes 95% of its memory, other
    # processes' memory included (it killed this test's runtime actors while other test runs
    # held 15 GB): off for these simulated nodes, which share one machine.
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "0")
    # Each weight sync ships the full weights (0.5 GB in float32) from rank 0's node to the
    # driver's. `Cluster` gives a node a 150 MiB object store by default, so they went to Ray's
    # disk fallback, which refuses once the disk is 95% used: a CI machine with 6.6 GiB free of
    # 252 failed with OutOfDiskError. The head and trainer nodes get stores that hold them, and
    # the fallback is refused at any disk use, so a sync that does not fit fails on every machine.
    monkeypatch.setenv("RAY_local_fs_capacity_threshold", "0.01")
    store = {"object_store_memory": OBJECT_STORE_BYTES}

    single_dir = tmp_path / "single"
    single = train(single_dir)
    assert single.returncode == 0, single.stderr[-4000:]

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, **store},
    )
    try:
        sandbox = cluster.add_node(num_cpus=1, resources={"sandbox": 16})
        trainer = cluster.add_node(num_cpus=2, resources={"trainer": 2}, **store)
        engine = cluster.add_node(num_cpus=1, resources={"engine": 1})
        cluster.wait_for_nodes()
        ray_dir = tmp_path / "ray"
        placed = train(
            ray_dir,
            f"cluster.address={cluster.address}",
            "trainer.backend=ray_fsdp",
            "cluster.trainer_workers=2",
        )
        assert placed.returncode == 0, placed.stderr[-4000:]
        # The same cluster, `conveyor eval` unchanged, its engine a replica on the engine node
        on_cluster = [f"cluster.address={cluster.address}", "cluster.engine_resource=engine"]
        evaluated = conveyor(
            "eval",
            "configs/quickstart-eval.yaml",
            *[
                arg
                for item in [
                    *TWO_STEPS[:2],
                    "tasks.num_tasks=1",  # the family's one eval instance, twice
                    "tasks.group_size=2",
                    "agent.max_turns=2",
                    "agent.max_completion_tokens=48",
                    f"run.dir={tmp_path / 'eval'}",
                    *on_cluster,
                ]
                for arg in ("--set", item)
            ],
        )
        assert evaluated.returncode == 0, evaluated.stderr[-4000:]
        summary = json.loads((tmp_path / "eval/summary.json").read_text())
        (replica,) = summary["engine_replicas"]["replicas"]
        assert replica["sessions"] == 2 and replica["down"] is None
        assert _guarded_servers() == []

        # every runtime on the sandbox node, both trainer ranks on the trainer node, none alive
        deadline = time.monotonic() + 60
        while live(table := actor_table(cluster.address)) and time.monotonic() < deadline:
            time.sleep(1)
        assert live(table) == []
        nodes: dict[str, set[str]] = {}
        counts: dict[str, int] = {}
        for actor in table:
            name = actor["ActorClassName"]
            nodes.setdefault(name, set()).add(actor["Address"]["NodeID"])
            counts[name] = counts.get(name, 0) + 1
        assert nodes == {
            "RuntimeHost": {sandbox.node_id},
            "TrainerWorker": {trainer.node_id},
            "EngineReplicaHost": {engine.node_id},
        }
        # the training rollouts' runtimes and the evaluation's two
        assert counts["TrainerWorker"] == 2 and counts["RuntimeHost"] >= ROLLOUTS + 2
        assert counts["EngineReplicaHost"] == 1
    finally:
        cluster.shutdown()

    # the same rollouts (tokens, statuses, rewards), so the updates see the same batches ...
    cluster_rollouts = rollouts(ray_dir)
    assert len(cluster_rollouts) == ROLLOUTS
    assert cluster_rollouts == rollouts(single_dir)
    # every sandbox started and graded (on the sandbox node), and some samples said the word
    assert all(r[3] != "infra_error" for r in cluster_rollouts)
    assert 0 < sum(r[4] for r in cluster_rollouts) < ROLLOUTS
    # ... and the same updates, at least one of them on a nonzero advantage
    ray_steps, single_steps = (
        records(ray_dir / "metrics.jsonl"),
        records(single_dir / "metrics.jsonl"),
    )
    assert [m["step"] for m in ray_steps] == [1, 2]
    assert any(m["train/skipped_samples"] < m["samples"] for m in ray_steps)
    for got, want in zip(ray_steps, single_steps, strict=True):
        assert got["train/loss"] == pytest.approx(want["train/loss"], abs=1e-5)
        assert got["train/grad_norm"] == pytest.approx(want["train/grad_norm"], rel=1e-4)
        assert got["train/policy_version"] == want["train/policy_version"]
    final = load_file(ray_dir / "final_model/model.safetensors")
    reference = load_file(single_dir / "final_model/model.safetensors")
    base = load_file(model_dir / "model.safetensors")
    assert final.keys() == reference.keys()
    worst = max(float((final[k] - reference[k]).abs().max()) for k in reference)
    moved = max(float((reference[k] - base[k]).abs().max()) for k in reference if k in base)
    assert worst < WEIGHT_TOLERANCE < moved / 10, (worst, moved)
    assert (ray_dir / "checkpoints").is_dir()  # written by the workers, where the driver said


def _guarded_servers() -> list[str]:
    """Command lines of engine servers a replica actor started that still run."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"conveyor.engines.server_guard" in argv:
            found.append(" ".join(a.decode(errors="replace") for a in argv))
    return found


def test_the_stages_a_sandbox_node_gets_carry_the_families_not_the_engine() -> None:
    """`RayStages` ships `AgentStages` to each runtime actor: the copy runs init and reward (the
    family's runtime and grader) and leaves behind the engine client, which cannot travel."""
    import asyncio
    import pickle
    import threading

    from conveyor.agent.chat import ChatRenderer
    from conveyor.config import AgentConfig, SamplingConfig
    from conveyor.rollout import AgentStages
    from conveyor.types import Trajectory

    class Engine:  # like an in-process engine: holds what pickle refuses
        lock = threading.Lock()

    def renderer(schemas: list[dict[str, Any]]) -> ChatRenderer:
        raise AssertionError("the run stage stays in the driver")

    stages = AgentStages(
        Engine(),  # type: ignore[arg-type]
        renderer,
        AgentConfig(),
        SamplingConfig(),
        rollout_timeout_s=60,
    )
    with pytest.raises(TypeError):
        pickle.dumps(Engine.lock)
    shipped = pickle.loads(pickle.dumps(stages))
    assert shipped.client is None and isinstance(stages.client, Engine)
    (task,) = shipped.family("arithmetic").make_tasks(1, 0, "eval")
    answer = str(task.data["answer"])

    async def init_and_reward() -> list[float | None]:
        runtime = await shipped.init(task, 0, 0)
        try:
            out = []
            for text in (answer, f"{answer}1"):
                done = Trajectory(task_id=task.id, messages=[{"role": "answer", "content": text}])
                out.append((await shipped.reward(task, done, runtime)).reward)
            return out
        finally:
            await runtime.close()

    assert asyncio.run(init_and_reward()) == [1.0, 0.0]
