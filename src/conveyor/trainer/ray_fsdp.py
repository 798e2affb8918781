"""`trainer.backend: ray_fsdp`: the built-in trainer as N Ray actors, one torch.distributed rank
each, sharded with FSDP2 when N > 1.

Each worker (`TrainerWorker`) holds one `TorchTrainingEngine` rank on a node that offers
`cluster.trainer_resource`; rank 0 picks the rendezvous address on its node, and the ranks form
a gloo group on CPU or an NCCL group on CUDA (`cluster.trainer_gpus_per_worker`). The driver
talks to them through `RayFsdpTrainer`, a plain `TrainingBackend`: every call goes to every
rank at once (the ranks' forwards and gathers are collective) and rank 0's answer comes back.
The RL loop, checkpoints and the fingerprint-checked weight sync use it unchanged.

Weight sync: the ranks gather the full (unsharded) state dict, rank 0 ships it to the driver
through Ray's object store, and the driver loads it into its engine (`update_weights`), which
is then checked by its weight fingerprint as for the in-process trainer.

Failure: a worker that raises or dies makes the driver kill every worker and raise (a rank left
alone would wait in a collective); workers that Ray cannot place within
`cluster.start_timeout_s` are killed and named, never waited for. Needs Ray and torch; the
model folder and the run folder (checkpoints) must be at the same paths on the trainer nodes.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.config import ConveyorConfig, TrainerConfig
from conveyor.config.cluster import ClusterConfig
from conveyor.engines.base import WeightFingerprint, WeightReceiver
from conveyor.trainer.backend import (
    BackendInfo,
    StepResult,
    TrainBatch,
    TrainingBackend,
    register_backend,
)
from conveyor.types import TrainingSample

if TYPE_CHECKING:
    from torch import Tensor

    from conveyor.dispatch.ray_cluster import RayCluster

# How long a collective may wait for a peer rank (torch's default is 30 minutes). The driver
# kills every rank as soon as one fails, so this only bounds a rank whose peer hangs.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


class TrainerWorker:
    """The body of one trainer actor: rank `rank` of `world_size`, one `TorchTrainingEngine`."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.engine: Any = None

    def rendezvous(self) -> str:
        """A `tcp://` address on this worker's node for the process group (rank 0's)."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        return f"tcp://{host}:{port}"

    def start(
        self,
        init_method: str,
        model_dir: str,
        settings: TrainerConfig,
        temperature: float,
        total_steps: int | None,
        threads: int,
    ) -> str:
        """Join the process group and load the model; returns this worker's Ray node id."""
        import ray
        import torch
        import torch.distributed as dist

        from conveyor.trainer.engine import TorchTrainingEngine, resolve_device

        node = ray.get_runtime_context().get_node_id()
        if not Path(model_dir).is_dir():
            raise FileNotFoundError(
                f"trainer worker {self.rank} on node {ray.util.get_node_ip_address()}: no "
                f"model folder at {model_dir}; every trainer node needs it at the driver's path"
            )
        torch.set_num_threads(max(threads, 1))
        if self.world_size > 1:
            device = resolve_device(settings.device)
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                init_method=init_method,
                rank=self.rank,
                world_size=self.world_size,
                timeout=COLLECTIVE_TIMEOUT,
            )
        self.engine = TorchTrainingEngine(
            model_dir,
            settings.model_copy(update={"fsdp": self.world_size > 1}),
            temperature=temperature,
            total_steps=total_steps,
        )
        return node

    def step(self, batch: TrainBatch) -> StepResult:
        """This rank's part of one update (every rank gets the whole batch)."""
        result: StepResult = self.engine.step(batch)
        return result

    def compute_logprobs(self, samples: Sequence[TrainingSample]) -> list[list[float]]:
        """The current policy's logprobs of `samples` (collective)."""
        out: list[list[float]] = self.engine.compute_logprobs(samples)
        return out

    def export(self) -> dict[str, Tensor] | None:
        """The full weights on CPU (rank 0; the others take part in the gathers, return None)."""
        weights = {}
        for name, tensor in self.engine.export_weights():
            if self.rank == 0:
                weights[name] = tensor.detach().to("cpu", copy=True)
        return weights if self.rank == 0 else None

    def weight_fingerprint(
        self, like: WeightFingerprint, probe_ids: Sequence[int]
    ) -> WeightFingerprint:
        """The trainer side of the weight-sync check (collective)."""
        fingerprint: WeightFingerprint = self.engine.weight_fingerprint(like, probe_ids)
        return fingerprint

    def save(self, path: str) -> None:
        """Write the training state into `path` (collective; rank 0 writes the files)."""
        if not Path(path).is_dir():
            raise FileNotFoundError(
                f"trainer worker {self.rank}: checkpoint folder {path} is not visible on its "
                "node; run.dir must be on a file system every trainer node mounts (or set "
                "rl.checkpoints.every: 0)"
            )
        self.engine.save(Path(path))

    def load(self, path: str) -> int:
        """Restore the training state from `path`; returns the policy version."""
        self.engine.load(Path(path))
        version_: int = self.engine.policy_version
        return version_


class TrainerWorkerError(RuntimeError):
    """A trainer worker failed or died; every worker of the trainer was stopped."""


class RayFsdpTrainer:
    """`TrainingBackend` (and `FingerprintedBackend`) whose ranks are Ray actors; see the module
    docstring. Build it with `start`; `close` kills the workers."""

    def __init__(self, cluster: RayCluster, workers: list[Any], nodes: list[str]) -> None:
        self._ray = cluster.ray
        self.workers = workers
        self.nodes = nodes  # the Ray node id of each rank
        self._version = 0

    @classmethod
    def start(
        cls,
        cluster: RayCluster,
        model_dir: Path,
        settings: TrainerConfig,
        *,
        temperature: float = 1.0,
        total_steps: int | None = None,
    ) -> RayFsdpTrainer:
        """Place `cluster.trainer_workers` workers, form their process group and load the model
        on each; `ClusterError` naming the placement when that takes past the start timeout."""
        from conveyor.dispatch.ray_cluster import ClusterError, describe_nodes

        ray, placement = cluster.ray, cluster.settings
        n = placement.trainer_workers
        actor = ray.remote(TrainerWorker).options(**worker_options(placement))
        workers = [actor.remote(rank, n) for rank in range(n)]
        trainer = cls(cluster, workers, [])
        deadline = time.monotonic() + placement.start_timeout_s
        try:
            (address,) = trainer._all([workers[0].rendezvous.remote()], deadline)
            threads = max(int(placement.trainer_cpus_per_worker), 1)
            started = [
                w.start.remote(address, str(model_dir), settings, temperature, total_steps, threads)
                for w in workers
            ]
            trainer.nodes = trainer._all(started, deadline)
        except TimeoutError:
            trainer.close()
            raise ClusterError(
                f"{n} trainer workers (each {{'{placement.trainer_resource}': 1}}, "
                f"{placement.trainer_cpus_per_worker:g} CPU, {placement.trainer_gpus_per_worker:g} "
                f"GPU) were not all placed and started within {placement.start_timeout_s:g} s "
                f"(cluster.start_timeout_s); nodes: {describe_nodes(ray)}"
            ) from None
        return trainer

    # -- the TrainingBackend protocol ------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """Updates made so far (rank 0's count)."""
        return self._version

    def step(self, batch: TrainBatch) -> StepResult:
        """One update on every rank from the same batch (shipped once); rank 0's metrics."""
        shipped = self._ray.put(batch)
        result: StepResult = self._all([w.step.remote(shipped) for w in self.workers])[0]
        self._version = result.policy_version
        return result

    def compute_logprobs(self, samples: Sequence[TrainingSample]) -> list[list[float]]:
        """Rank 0's logprobs (every rank computes them: the forwards are collective)."""
        shipped = self._ray.put(list(samples))
        rows: list[list[float]] = self._all(
            [w.compute_logprobs.remote(shipped) for w in self.workers]
        )[0]
        return rows

    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The full weights rank 0 gathered, on the driver's CPU."""
        weights: dict[str, Tensor] = self._all([w.export.remote() for w in self.workers])[0]
        yield from weights.items()

    async def sync_to(self, engine: Any, *, step: int = 0) -> None:
        """Gather the full weights to the driver, then load them into `engine` (a
        `WeightReceiver`) under this trainer's policy version."""
        from conveyor.trainer.faults import killing_midway

        weights = await asyncio.to_thread(lambda: dict(self.export_weights()))
        await engine.update_weights(killing_midway(iter(weights.items()), step), self._version)

    def weight_fingerprint(
        self, like: WeightFingerprint, probe_ids: Sequence[int]
    ) -> WeightFingerprint:
        """Rank 0's fingerprint of the trainer's weights (`FingerprintedBackend`)."""
        calls = [w.weight_fingerprint.remote(like, list(probe_ids)) for w in self.workers]
        fingerprint: WeightFingerprint = self._all(calls)[0]
        return fingerprint

    def save(self, path: Path) -> None:
        """Every rank saves into `path` (which the trainer nodes must see)."""
        self._all([w.save.remote(str(path)) for w in self.workers])

    def load(self, path: Path) -> None:
        """Every rank restores from `path`."""
        self._version = self._all([w.load.remote(str(path)) for w in self.workers])[0]

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every worker (their process group goes with them); idempotent."""
        workers, self.workers = self.workers, []
        for worker in workers:
            self._ray.kill(worker, no_restart=True)

    def _all(self, refs: list[Any], deadline: float | None = None) -> list[Any]:
        """The results of one call per worker, in order. The first failure kills every worker
        and raises (its own exception where it has one); `TimeoutError` past `deadline`."""
        ray = self._ray
        if not self.workers:
            raise TrainerWorkerError("the trainer's workers were stopped")
        pending = list(refs)
        while pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                raise TimeoutError
            try:
                ray.get(ready[0])
            except ray.exceptions.RayTaskError as error:
                self.close()
                cause = getattr(error, "cause", None)
                if isinstance(cause, Exception):
                    raise cause from error
                raise TrainerWorkerError(f"a trainer worker failed: {error}") from error
            except ray.exceptions.RayError as error:
                self.close()
                raise TrainerWorkerError(
                    f"a trainer worker was lost ({type(error).__name__}: {error}); every "
                    "worker was stopped"
                ) from error
        return list(ray.get(refs))


def worker_options(placement: ClusterConfig) -> dict[str, Any]:
    """Ray actor options of one trainer worker."""
    return {
        "resources": {placement.trainer_resource: 1.0},
        "num_cpus": placement.trainer_cpus_per_worker,
        "num_gpus": placement.trainer_gpus_per_worker,
        "max_restarts": 0,
    }


class RayFsdpBackend:
    """The `BackendSpec` of `ray_fsdp`."""

    def info(self) -> BackendInfo:
        """Usable where Ray and torch are installed."""
        versions: dict[str, str | None] = {}
        for package in ("ray", "torch"):
            try:
                versions[package] = version(package)
            except PackageNotFoundError:
                versions[package] = None
        missing = [name for name, found in versions.items() if found is None]
        return BackendInfo(
            name="ray_fsdp",
            version=versions["ray"],
            train=not missing,
            eval=True,
            sync="rank 0 gathers the full weights, the driver loads them into its engine's "
            "update_weights (in-process vllm/hf, or a dev-mode vLLM server)",
            reason=f"{' and '.join(missing)} not installed (pip install 'conveyor[ray]')"
            if missing
            else "",
        )

    def refusal(self, config: ConveyorConfig, engine: Any) -> str | None:
        """Engines that cannot take tensors in place and report what they serve are refused."""
        if isinstance(engine, WeightReceiver):
            return None
        return (
            f"engine.kind={config.engine.kind!r} cannot take new weights in place and report "
            "what it serves; trainer.backend 'ray_fsdp' needs engine.kind 'vllm', 'hf' or "
            "'openai' against a dev-mode vLLM server"
        )

    def build(
        self, config: ConveyorConfig, model_dir: Path, settings: TrainerConfig
    ) -> TrainingBackend:
        """`cluster.trainer_workers` workers on the cluster (joined here unless the run already
        is a driver), each starting from `model_dir`."""
        from conveyor.dispatch.ray_cluster import connect

        placement = config.cluster
        cluster = connect(placement, trainer_workers=placement.trainer_workers)
        temperature = config.sampling.temperature
        return RayFsdpTrainer.start(
            cluster,
            model_dir,
            settings,
            temperature=temperature if temperature > 0 else 1.0,
            total_steps=max(config.rl.steps, 1) if settings.schedule != "constant" else None,
        )


register_backend(
    "ray_fsdp", RayFsdpBackend(), exports_model=True, distributed=True, warm_start=True
)
