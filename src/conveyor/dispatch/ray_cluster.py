"""Joining the Ray cluster `cluster.address` names, checked before anything is placed on it.

`connect(settings, trainer_workers=N)` returns a `RayCluster`: this process is then a Ray driver
that can place runtimes (`RayCluster.place`, on nodes offering `cluster.sandbox_resource`) and
trainer workers (`conveyor.trainer.ray_fsdp`, on nodes offering `cluster.trainer_resource`).
What can go wrong at start fails here with one `ClusterError`, never as actors pending forever:

- an address nothing answers at: a TCP probe with `connect_timeout_s` first (Ray's own
  `ray.init` retries an unreachable head for minutes);
- a cluster without a node offering the sandbox resource, or with fewer trainer units than
  `trainer_workers`: the cluster's resources are read before the first actor is asked for.

`RayCluster.shutdown` ends this driver's Ray session when `connect` started it, which kills
every actor the run created (Ray ties non-detached actors to their driver). Ray is imported only
here and in the modules that place actors (`pip install 'conveyor[ray]'`).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from conveyor.config.cluster import LOCAL, ClusterConfig
from conveyor.dispatch.ray_executor import LOCAL_RESOURCE_UNITS, RayExecutor, import_ray
from conveyor.dispatch.stages import RolloutStages

DEFAULT_GCS_PORT = 6379


class ClusterError(RuntimeError):
    """The Ray cluster cannot host this run (unreachable, or missing a kind of node); the
    message says what was found and which setting or node to change."""


@dataclass
class RayCluster:
    """A connected Ray driver and the placement settings of this run."""

    ray: Any
    settings: ClusterConfig
    owned: bool  # whether `connect` started this Ray session (and `shutdown` ends it)

    def place(self, stages: RolloutStages) -> RolloutStages:
        """`stages` whose init and reward run in one Ray actor per rollout, placed on a node
        that offers the sandbox resource (`conveyor.dispatch.ray_executor`)."""
        executor = RayExecutor(resources={self.settings.sandbox_resource: 1.0}, num_cpus=0.0)
        return executor.place(stages)

    def shutdown(self) -> None:
        """End the Ray session `connect` started (its actors die with it); idempotent."""
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()
        self.owned = False


def connect(
    settings: ClusterConfig, *, trainer_workers: int = 0, engine_replicas: int = 0
) -> RayCluster:
    """This process as a driver of the cluster `settings.address` names (a fresh local Ray for
    'local'; the running session when Ray is already initialised), checked to offer the sandbox
    resource, `trainer_workers` units of the trainer resource and `engine_replicas` units of the
    engine resource."""
    if settings.address is None:
        raise ValueError("cluster.address is null: this run does not use Ray")
    ray = import_ray()
    owned = not ray.is_initialized()
    if owned:
        if settings.address == LOCAL:
            # A local Ray has no custom resources of its own: offer what this run asks for.
            resources = {settings.sandbox_resource: LOCAL_RESOURCE_UNITS}
            if trainer_workers:
                resources[settings.trainer_resource] = float(trainer_workers)
            if engine_replicas and settings.engine_resource is not None:
                resources[settings.engine_resource] = float(engine_replicas)
            ray.init(resources=resources, include_dashboard=False)
        else:
            _join(ray, settings)
    cluster = RayCluster(ray, settings, owned)
    try:
        check_resources(ray, settings, trainer_workers, engine_replicas)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


def _join(ray: Any, settings: ClusterConfig) -> None:
    address = str(settings.address)
    target = head_endpoint(address)
    if target is not None:
        host, port = target
        try:
            with socket.create_connection((host, port), timeout=settings.connect_timeout_s):
                pass
        except OSError as error:
            raise ClusterError(
                f"cluster.address {address!r}: nothing answers at {host}:{port} ({error}; "
                f"waited up to {settings.connect_timeout_s:g} s): start the cluster's head "
                "(`ray start --head`) or fix cluster.address ('local' starts a Ray here)"
            ) from None
    started = time.monotonic()
    try:
        ray.init(address=address)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise ClusterError(
            f"cluster.address {address!r}: could not join the Ray cluster after "
            f"{time.monotonic() - started:.0f} s: {error}"
        ) from None


def head_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) a cluster address points at, or None for 'auto' (Ray finds it)."""
    if address == "auto":
        return None
    rest = address.removeprefix("ray://")
    default = 10001 if address.startswith("ray://") else DEFAULT_GCS_PORT
    host, sep, port = rest.rpartition(":")
    if not sep or "]" in port:  # no port given ("host", or a bare "[v6]")
        host, port = rest, str(default)
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise ClusterError(
            f"cluster.address {address!r} is not HOST:PORT, ray://HOST:PORT, 'auto' or 'local'"
        )
    return host, int(port)


def check_resources(
    ray: Any, settings: ClusterConfig, trainer_workers: int = 0, engine_replicas: int = 0
) -> None:
    """`ClusterError` unless some node offers the sandbox resource, the trainer resource, CPUs
    and GPUs add up to what `trainer_workers` workers ask for, and the engine resource to
    `engine_replicas` units (actors asking for what the cluster does not have would pend
    forever). Totals, not per node: an actor that fits no single node is caught by
    `cluster.start_timeout_s`."""
    total = ray.cluster_resources()
    problems = []
    sandbox, trainer = settings.sandbox_resource, settings.trainer_resource
    if total.get(sandbox, 0.0) < 1.0:
        problems.append(
            f"no node offers the resource '{sandbox}' that every rollout's runtime is placed "
            f"by: start sandbox nodes with `ray start --address=HEAD --resources="
            f"'{{\"{sandbox}\": 64}}'`, or set cluster.sandbox_resource to the name they offer"
        )
    if trainer_workers and total.get(trainer, 0.0) < trainer_workers:
        problems.append(
            f"cluster.trainer_workers is {trainer_workers} but the nodes offer "
            f"{total.get(trainer, 0.0):g} units of '{trainer}' (one per worker): add trainer "
            "nodes (`--resources='{\"" + trainer + "\": N}'`), lower cluster.trainer_workers, "
            "or set cluster.trainer_resource"
        )
    engine = settings.engine_resource
    if engine_replicas and engine is not None and total.get(engine, 0.0) < engine_replicas:
        problems.append(
            f"engine.replicas is {engine_replicas} but the nodes offer "
            f"{total.get(engine, 0.0):g} units of '{engine}' (one per replica, "
            "cluster.engine_resource): start engine nodes with `ray start --address=HEAD "
            "--resources='{\"" + engine + "\": 1}'`, or lower engine.replicas"
        )
    # CPUs and GPUs: the engine replicas' (when they are actors) and the trainer workers' together
    replicas = engine_replicas if engine is not None else 0
    for kind, per_replica, per_worker in (
        ("CPU", settings.engine_cpus_per_replica, settings.trainer_cpus_per_worker),
        ("GPU", settings.engine_gpus_per_replica, settings.trainer_gpus_per_worker),
    ):
        unit = kind.lower()
        parts = [
            f"{count} {who} x cluster.{key}_{unit}s_per_{each} {per:g}"
            for count, who, key, each, per in (
                (replicas, "engine replicas", "engine", "replica", per_replica),
                (trainer_workers, "trainer workers", "trainer", "worker", per_worker),
            )
            if count and per
        ]
        wanted = replicas * per_replica + trainer_workers * per_worker
        if wanted and total.get(kind, 0.0) < wanted:
            problems.append(
                " + ".join(parts)
                + f" = {wanted:g} {kind}s, but the cluster has {total.get(kind, 0.0):g}"
            )
    if problems:
        raise ClusterError(
            f"the Ray cluster at {settings.address!r} cannot host this run: "
            + "; ".join(problems)
            + f" (its nodes: {describe_nodes(ray)})"
        )


def describe_nodes(ray: Any) -> str:
    """One line per live node: its address and the resources it offers."""
    nodes = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        resources = {
            name: value
            for name, value in node.get("Resources", {}).items()
            if not name.startswith("node:") and name not in ("memory", "object_store_memory")
        }
        shown = ", ".join(f"{name}: {value:g}" for name, value in sorted(resources.items()))
        nodes.append(f"{node.get('NodeManagerAddress', '?')} {{{shown}}}")
    return "; ".join(nodes) or "none alive"
