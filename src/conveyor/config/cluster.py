"""The `cluster` section: whether a run is placed on Ray, and where on it each part goes.

Torch- and Ray-free; `conveyor.dispatch.ray_cluster` connects, `docs/scale.md` ("Ray cluster")
says what lands where.
"""

from pydantic import Field, field_validator

from conveyor.config.base import Section

# `cluster.address` value that starts a Ray on this machine instead of joining one.
LOCAL = "local"


class ClusterConfig(Section):
    """Where the parts of a run live when it runs on a Ray cluster.

    With `address` null (the default) nothing uses Ray: engine, runtimes and trainer live in this
    process. With an address, every rollout's runtime is a Ray actor on a node that offers
    `sandbox_resource`, and with `trainer.backend: ray_fsdp` the trainer is `trainer_workers`
    Ray actors on nodes that offer `trainer_resource` (FSDP2 over torch.distributed). The
    sampling engine stays in this process (the Ray driver) unless `engine_resource` is set: then
    each of `engine.replicas` is a vLLM server started by a Ray actor on a node that offers it,
    behind the session-aware router.
    """

    address: str | None = Field(
        default=None,
        description="null: no Ray (everything in this process). 'local': start a Ray on this "
        "machine that offers the sandbox and trainer resources. Otherwise the address of a "
        "running cluster: 'auto', 'HOST:PORT' of its head (GCS, default port 6379) or "
        "'ray://HOST:PORT' (Ray client).",
    )
    sandbox_resource: str = Field(
        default="sandbox",
        min_length=1,
        description="The custom Ray resource of nodes that host sandboxes (`ray start "
        "--resources='{\"sandbox\": 64}'`): each rollout's runtime actor asks for one unit, so "
        "a node's count bounds the sandboxes it runs at once.",
    )
    trainer_resource: str = Field(
        default="trainer",
        min_length=1,
        description="The custom Ray resource of nodes that host trainer workers; each worker "
        "asks for one unit.",
    )
    trainer_workers: int = Field(
        default=1,
        ge=1,
        description="trainer.backend 'ray_fsdp': how many trainer workers (torch.distributed "
        "ranks; more than one shards the model with FSDP2, gloo on CPU, NCCL on GPU).",
    )
    trainer_cpus_per_worker: float = Field(
        default=1.0, ge=0, description="CPUs Ray reserves for each trainer worker."
    )
    trainer_gpus_per_worker: float = Field(
        default=0.0,
        ge=0,
        description="GPUs Ray reserves for each trainer worker (1 on a GPU cluster: the "
        "worker then trains on CUDA and the ranks talk over NCCL).",
    )
    engine_resource: str | None = Field(
        default=None,
        min_length=1,
        description="null: the engine lives in this process (the driver). A custom resource "
        "name (e.g. 'engine'): each of engine.replicas (engine.kind 'vllm') is a vLLM server "
        "in development mode, started and owned by a Ray actor that asks for one unit of it, "
        "behind the session-aware router; weight versions go to RUN/weights, which every "
        "engine node must read at the same path (a shared filesystem).",
    )
    engine_cpus_per_replica: float = Field(
        default=1.0, ge=0, description="CPUs Ray reserves for each engine replica's actor."
    )
    engine_gpus_per_replica: float = Field(
        default=0.0,
        ge=0,
        description="GPUs Ray reserves for each engine replica (1 on a GPU cluster: Ray "
        "gives the actor, and the server it starts, that GPU).",
    )
    connect_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="How long joining the cluster at `address` may take before the run stops "
        "with one message (Ray itself would keep retrying for minutes).",
    )
    start_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="How long the trainer workers may take to be placed and load the model "
        "before the run stops with one message, instead of waiting forever for a node.",
    )

    @field_validator("sandbox_resource", "trainer_resource", "engine_resource")
    @classmethod
    def _custom_resource(cls, name: str | None) -> str | None:
        if name in ("CPU", "GPU", "memory", "object_store_memory"):
            raise ValueError(
                f"{name!r} is one of Ray's own resources; name the custom resource the nodes "
                "offer (e.g. 'sandbox', 'trainer')"
            )
        return name
