"""`cluster.engine_resource`: engine replicas as Ray actors on the cluster's engine nodes.

Each of `engine.replicas` is an `EngineReplicaHost` actor that asks for one unit of
`cluster.engine_resource` (plus `cluster.engine_cpus_per_replica` CPUs and
`cluster.engine_gpus_per_replica` GPUs, which Ray gives the server through the actor's
environment). The actor starts a vLLM server in development mode on its node, listening on the
node's address (`server_command`, `server_env`: the settings of local replicas), and owns it: the
server runs under `conveyor.engines.server_guard`, so it stops when the actor's process ends,
however it ends (Ray kills a run's actors with their driver). The driver samples from the
servers over HTTP (`VLLMServerEngine`), behind the session-aware router, and training reaches
them as it reaches any replica server: weights written under RUN/weights, reloaded by path, so
that folder must be readable at the same path on every engine node.

`start_ray_replicas` returns when every server answers, or stops every actor and raises one
`EngineError`: the first server that exited or did not answer (with the tail of its log, read
on its node), or the replicas Ray could not place within `cluster.start_timeout_s`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from conveyor.config.cluster import ClusterConfig
from conveyor.engines.base import EngineError
from conveyor.engines.memory import check_tensor_parallel, eager_mode
from conveyor.engines.vllm_replicas import (
    ServerProcess,
    free_ports,
    server_command,
    server_env,
    wait_until_up,
)
from conveyor.engines.vllm_server import VLLMServerEngine
from conveyor.engines.weight_group import DEFAULT_BUCKET_MB

_STOP_TIMEOUT_S = 60.0


class EngineReplicaHost:
    """The body of one engine replica's actor: starts, watches and stops its vLLM server."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.server: ServerProcess | None = None

    def start(
        self, model_dir: str, settings: dict[str, Any], start_timeout_s: float
    ) -> dict[str, str]:
        """Start the server; its URL and log once it answers (an `EngineError` otherwise)."""
        import ray

        host = ray.util.get_node_ip_address()
        (port,) = free_ports(1, host)
        gpus = ray.get_gpu_ids()
        check_tensor_parallel(settings.get("tensor_parallel_size", 1), bool(gpus))
        env, utilization, dtype = server_env(
            settings["kv_cache_gib"],
            settings["dtype"],
            gpu=",".join(str(g) for g in gpus) if gpus else None,
        )
        command = server_command(
            Path(model_dir),
            port,
            max_num_seqs=settings["max_num_seqs"],
            max_model_len=settings["max_model_len"],
            dtype=dtype,
            seed=settings["seed"],
            gpu_memory_utilization=utilization,
            extra_args=list(settings["extra_args"]),
            host=host,
            tensor_parallel_size=settings.get("tensor_parallel_size", 1),
            weight_sync=settings.get("weight_sync", "auto"),
            eager=eager_mode(settings.get("cuda_graphs"), bool(gpus)),
        )
        guarded = [sys.executable, "-m", "conveyor.engines.server_guard", str(os.getpid()), "--"]
        log = Path(tempfile.mkdtemp(prefix="conveyor-replica-")) / f"replica-{self.index}.log"
        self.server = ServerProcess([*guarded, *command], env, port, log, host=host)
        try:
            wait_until_up([self.server], start_timeout_s, first_index=self.index)
        except BaseException:
            self.server.stop()
            raise
        return {"url": self.server.url, "log": f"{host}:{log}"}

    def stop(self) -> None:
        """Stop the server (its whole process group); idempotent."""
        if self.server is not None:
            self.server.stop()


class RayReplicaEngine(VLLMServerEngine):
    """A `VLLMServerEngine` whose server an `EngineReplicaHost` actor owns: `close` stops the
    server and ends the actor."""

    def __init__(self, actor: Any, url: str, log: str, model: str, **options: Any) -> None:
        super().__init__(url, model, **options)
        self.actor = actor
        self.log = log

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            await asyncio.to_thread(_end, self.actor)


def _end(actor: Any) -> None:
    import ray

    try:
        ray.get(actor.stop.remote(), timeout=_STOP_TIMEOUT_S)
    except Exception:  # dead already, or stuck: the kill below ends it either way
        pass
    ray.kill(actor)


def start_ray_replicas(
    model_dir: Path,
    count: int,
    cluster: ClusterConfig,
    *,
    settings: dict[str, Any],
    client_options: dict[str, Any],
    start_timeout_s: float,
) -> list[RayReplicaEngine]:
    """Start `count` replica actors (see module doc); their clients once every server answers.

    `settings`: `max_num_seqs`, `max_model_len`, `kv_cache_gib`, `dtype`, `seed`, `extra_args`
    of each server. This process must already be a driver of the cluster (`connect`)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayTaskError

    if cluster.engine_resource is None:
        raise ValueError("cluster.engine_resource is null: the engine is not placed on Ray")
    host_class = ray.remote(EngineReplicaHost).options(
        resources={cluster.engine_resource: 1.0},
        num_cpus=cluster.engine_cpus_per_replica,
        num_gpus=cluster.engine_gpus_per_replica,
    )
    actors: list[Any] = [host_class.remote(index) for index in range(count)]
    started = [actor.start.remote(str(model_dir), settings, start_timeout_s) for actor in actors]
    try:
        # placement and start-up together; the servers' own deadline comes first if placed
        answers = ray.get(started, timeout=cluster.start_timeout_s + start_timeout_s)
    except RayTaskError as error:
        _end_all(actors)
        cause = error.cause if isinstance(error.cause, EngineError) else error
        raise EngineError(str(cause)) from None
    except GetTimeoutError:
        ready, _ = ray.wait(started, num_returns=len(started), timeout=0)
        _end_all(actors)
        raise EngineError(
            f"{len(started) - len(ready)} of {count} engine replicas were not placed and "
            f"started within {cluster.start_timeout_s + start_timeout_s:g} s: no node with "
            f"'{cluster.engine_resource}' had {cluster.engine_cpus_per_replica:g} CPUs and "
            f"{cluster.engine_gpus_per_replica:g} GPUs free for them, or their servers were "
            "still starting (cluster.start_timeout_s)"
        ) from None
    except BaseException:
        _end_all(actors)
        raise
    return [
        RayReplicaEngine(
            actor,
            answer["url"],
            answer["log"],
            str(model_dir),
            source_dir=model_dir,
            weight_sync=settings.get("weight_sync", "auto"),
            weight_bucket_mb=settings.get("weight_bucket_mb", DEFAULT_BUCKET_MB),
            **client_options,
        )
        for actor, answer in zip(actors, answers, strict=True)
    ]


def _end_all(actors: list[Any]) -> None:
    """End actors that may be mid-start (a `stop` would queue behind it): their servers' guards
    stop the servers."""
    import ray

    for actor in actors:
        ray.kill(actor)
