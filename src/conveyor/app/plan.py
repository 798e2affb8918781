"""`conveyor plan CONFIG --nodes N --gpus-per-node G --gpu-memory-gib M`: will the run fit?

Per-device memory of the trainer (`trainer.memory.trainer_memory`) and of the engines
(`engines.memory.engine_memory`), where each part is placed, and a refusal naming the config key
to change when a part cannot fit. `conveyor train` runs the same plan before it starts
(`check_gpu_fit`, from `check_plan`) when the trainer's device is this machine's GPU.

Placement v1 (docs/scale.md, "Memory plan"): devices are numbered node by node, `nodes x
gpus_per_node` of them, all with `gpu_memory_gib`. Engines (`engine.kind: vllm`): one engine in
this process (`engine.replicas: 1`, no `cluster.engine_resource`) runs on devices 0..tp-1 next
to the trainer, at `COLOCATED_GPU_SHARE` of each, the trainer getting the rest; replicas (local
servers: node 0; Ray replicas: anywhere) take the last `replicas x tensor_parallel_size`
devices, at `REPLICA_GPU_SHARE` each, and nothing else goes there. The trainer: the built-in
backend trains on device 0, or with `trainer.fsdp` shards over `trainer.fsdp_ranks` devices of
node 0 (default: every one no replica holds; one local rank process a device); `ray_fsdp` runs
`cluster.trainer_workers` ranks, one device each, on the first devices no replica holds. Other
engine kinds and trainer backends run elsewhere and are not planned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.config import ConfigError, ConveyorConfig
from conveyor.engines.memory import (
    COLOCATED_GPU_SHARE,
    REPLICA_GPU_SHARE,
    engine_memory,
)
from conveyor.models import model_architecture
from conveyor.trainer.memory import DTYPE_BYTES, GIB, Architecture, trainer_memory

# the CUDA context, NCCL buffers and the allocator's fragmentation on a trainer device:
# assumed (the GPU check's peaks are torch's allocated bytes, which exclude them)
TRAINER_RESERVE_BYTES = 2 * GIB
CHUNK_SUGGESTION = 4096


@dataclass(frozen=True)
class Hardware:
    nodes: int
    gpus_per_node: int
    gpu_memory_gib: float

    @property
    def devices(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def memory(self) -> int:
        return int(self.gpu_memory_gib * GIB)


def logits_chunk_tokens(config: ConveyorConfig) -> int | None:
    """`trainer.logits_chunk_tokens` where this version's config has that key, else None."""
    if "logits_chunk_tokens" not in type(config.trainer).model_fields:
        return None
    value = config.trainer.model_dump().get("logits_chunk_tokens")
    return int(value) if value else None


def _gib(value: float) -> float:
    return round(value / GIB, 2)


def _trainer_inputs(config: ConveyorConfig, arch: Architecture) -> dict[str, Any]:
    """The trainer settings the memory model takes, from the config (module doc)."""
    trainer = config.trainer
    context = config.agent.max_context_tokens
    # a sequence longer than micro_batch_tokens is a pass of its own (trainer.batching)
    tokens = max(trainer.micro_batch_tokens, context)
    row_length = min(tokens, context)
    trainable: int | None = None
    if trainer.lora.enabled:
        trainable = arch.lora_parameters(trainer.lora.r, trainer.lora.target_modules)
        if trainer.train_last_layers is not None:
            trainable = trainable * min(trainer.train_last_layers, arch.layers) // arch.layers
    elif trainer.train_last_layers is not None:
        trainable = min(trainer.train_last_layers, arch.layers) * arch.layer_parameters()
        trainable += arch.hidden
    return {
        "tokens": tokens,
        "rows": -(-tokens // row_length),
        "param_bytes": 4,  # the built-in trainer keeps float32 weights and AdamW state
        "autocast": trainer.dtype != "float32",  # auto: bf16 on a GPU that has it
        "trainable": trainable,
        "checkpointing": trainer.gradient_checkpointing,
        "logits_chunk_tokens": logits_chunk_tokens(config),
        "dense_mask": True,  # right-padded rows under sdpa
        "context_parallel": int(getattr(trainer, "context_parallel", 1)),
    }


def _alternatives(
    config: ConveyorConfig, arch: Architecture, inputs: dict[str, Any], shards: int, free: int
) -> list[tuple[str, str, dict[str, Any], int]]:
    """Single changes that lower the trainer's memory: (key, value, inputs, shards)."""
    out: list[tuple[str, str, dict[str, Any], int]] = []
    trainer = config.trainer
    backend = trainer.backend.name
    if backend == "builtin" and not trainer.fsdp and free > 1:
        out.append(("trainer.fsdp", "true", inputs, free))
    if backend == "ray_fsdp" and config.cluster.trainer_workers < free:
        out.append(("cluster.trainer_workers", str(free), inputs, free))
    if not inputs["checkpointing"]:
        out.append(("trainer.gradient_checkpointing", "true", {**inputs, "checkpointing": True}, 0))
    if trainer.fsdp and inputs["context_parallel"] == 1 and shards > 1 and shards % 2 == 0:
        split = {**inputs, "context_parallel": 2}
        out.append(("trainer.context_parallel", "2", split, 0))
    has_chunks = "logits_chunk_tokens" in type(trainer).model_fields
    if has_chunks and not inputs["logits_chunk_tokens"]:
        chunked = {**inputs, "logits_chunk_tokens": CHUNK_SUGGESTION}
        out.append(("trainer.logits_chunk_tokens", str(CHUNK_SUGGESTION), chunked, 0))
    context = config.agent.max_context_tokens
    if trainer.micro_batch_tokens > context:
        fewer = {**inputs, "tokens": context, "rows": 1}
        out.append(("trainer.micro_batch_tokens", str(context), fewer, 0))
    else:
        half = context // 2
        shorter = {**inputs, "tokens": max(half, trainer.micro_batch_tokens), "rows": 1}
        out.append(("agent.max_context_tokens", str(half), shorter, 0))
    if not trainer.lora.enabled and inputs["trainable"] is None:
        lora = {
            **inputs,
            "trainable": arch.lora_parameters(trainer.lora.r, trainer.lora.target_modules),
        }
        out.append(("trainer.lora.enabled", "true", lora, 0))
    return [(k, v, i, s or shards) for k, v, i, s in out]


def plan_memory(config: ConveyorConfig, hardware: Hardware) -> dict[str, Any]:
    """The plan of `config` on `hardware`: placement, per-device memory, refusals (module doc).

    Raises `ModelError` when the model's architecture is neither on disk nor shipped.
    """
    if hardware.nodes < 1 or hardware.gpus_per_node < 1 or hardware.gpu_memory_gib <= 0:
        raise ConfigError("nodes, gpus per node and GPU memory must be positive")
    raw, source = model_architecture(config.model.path)
    try:
        arch = Architecture.from_config(raw)
    except KeyError as exc:
        raise ConfigError(f"model.path: {source}: {exc.args[0]}") from exc
    devices, memory, per_node = hardware.devices, hardware.memory, hardware.gpus_per_node
    refusals: list[dict[str, str]] = []

    def refuse(key: str, message: str) -> None:
        refusals.append({"key": key, "message": message})

    # --- engines -------------------------------------------------------------------------
    engine = config.engine
    tp = engine.tensor_parallel_size
    engine_devices: list[int] = []
    colocated = False
    engine_part: dict[str, Any] | None = None
    if engine.kind == "vllm":
        replicas = engine.replicas
        if tp > per_node:
            refuse(
                "engine.tensor_parallel_size",
                f"engine.tensor_parallel_size={tp} is more than the {per_node} GPUs of a node "
                "(one engine's ranks stay on one node)",
            )
        if config.cluster.engine_resource is None and replicas == 1:
            colocated = True
            engine_devices = list(range(min(tp, devices)))
            share = COLOCATED_GPU_SHARE
            where = "in this process, next to the trainer's first devices"
        else:
            local = config.cluster.engine_resource is None
            room = per_node if local else devices
            if replicas * tp > room:
                refuse(
                    "engine.replicas",
                    f"engine.replicas={replicas} x engine.tensor_parallel_size={tp} needs "
                    f"{replicas * tp} GPUs, and {'node 0' if local else 'the cluster'} has "
                    f"{room}",
                )
            last = per_node if local else devices
            engine_devices = list(range(max(0, last - replicas * tp), last))
            share = REPLICA_GPU_SHARE
            where = "local vLLM servers on node 0" if local else "vLLM servers placed by Ray"
            gpus_each = config.cluster.engine_gpus_per_replica
            if not local and gpus_each < tp:
                refuse(
                    "cluster.engine_gpus_per_replica",
                    f"cluster.engine_gpus_per_replica={gpus_each:g}: Ray must give each replica "
                    f"its engine.tensor_parallel_size={tp} GPUs",
                )
        weight_bytes = DTYPE_BYTES.get(engine.dtype, 2)  # auto: the model's bf16 on a GPU
        given = "kv_cache_gib" in engine.model_fields_set
        context = config.agent.max_context_tokens
        parts = engine_memory(
            arch.parameters(),
            arch.kv_bytes_per_token(weight_bytes),
            weight_bytes=weight_bytes,
            tensor_parallel=tp,
            kv_cache_bytes=int(engine.kv_cache_gib * GIB) if given else None,
            max_num_seqs=engine.max_num_seqs,
            max_context_tokens=context,
            share_bytes=int(share * memory),
        )
        kv_key = "engine.kv_cache_gib" if given else "engine.max_num_seqs"
        if parts["total"] > parts["share"]:
            short = (
                "its weights and runtime reserve alone"
                if parts["weights"] + parts["runtime_reserve"] > parts["share"]
                else f"{kv_key} asks {_gib(parts['kv_cache'])} GiB of KV cache a device, and "
                f"{_gib(parts['kv_available'])} GiB are left"
            )
            key = (
                "engine.tensor_parallel_size"
                if parts["weights"] + parts["runtime_reserve"] > parts["share"]
                else kv_key
            )
            refuse(
                key,
                f"an engine device needs {_gib(parts['total'])} GiB, more than its "
                f"{share:g} share of {hardware.gpu_memory_gib:g} GiB "
                f"({_gib(parts['share'])} GiB): {short}; lower {key}"
                + (
                    ""
                    if key == "engine.tensor_parallel_size"
                    else ", or raise engine.tensor_parallel_size"
                ),
            )
        elif parts["full_context_sequences"] < 1:
            refuse(
                "agent.max_context_tokens",
                f"the engine's KV cache holds {parts['kv_tokens_available']} tokens, fewer than "
                f"one agent.max_context_tokens={context} sequence",
            )
        engine_part = {
            "where": where,
            "devices": engine_devices,
            "replicas": replicas,
            "tensor_parallel_size": tp,
            "share": share,
            "kv_cache_from": "engine.kv_cache_gib"
            if given
            else "engine.max_num_seqs x agent.max_context_tokens",
            "full_context_sequences": parts["full_context_sequences"],
            "per_device_gib": {
                k: _gib(parts[k]) for k in ("weights", "kv_cache", "runtime_reserve", "total")
            },
            "budget_gib": _gib(parts["share"]),
        }

    # --- trainer -------------------------------------------------------------------------
    trainer_part: dict[str, Any] | None = None
    backend = config.trainer.backend.name
    exclusive = set() if colocated else set(engine_devices)
    on_gpu = config.trainer.device != "cpu" and (
        backend == "builtin" or config.cluster.trainer_gpus_per_worker > 0
    )
    if backend in ("builtin", "ray_fsdp") and on_gpu:
        if backend == "builtin":
            free = [d for d in range(per_node) if d not in exclusive]
            wanted = (config.trainer.fsdp_ranks or len(free)) if config.trainer.fsdp else 1
            if wanted > len(free):
                refuse(
                    "trainer.fsdp_ranks",
                    f"trainer.fsdp_ranks={wanted} needs {wanted} devices of node 0 and "
                    f"{len(free)} are free of engine replicas",
                )
            where = "this process" + (", FSDP over node 0's free devices" if wanted > 1 else "")
        else:
            free = [d for d in range(devices) if d not in exclusive]
            wanted = config.cluster.trainer_workers
            where = "Ray workers (cluster.trainer_workers), one device each"
            if wanted > len(free):
                refuse(
                    "cluster.trainer_workers",
                    f"cluster.trainer_workers={wanted} needs {wanted} devices and "
                    f"{len(free)} are free of engine replicas",
                )
        trainer_devices = free[:wanted]
        if not trainer_devices:
            refuse(
                "engine.replicas",
                "the engine replicas take every device of node 0 and leave none to the trainer",
            )
        shards = max(1, len(trainer_devices)) if config.trainer.fsdp or wanted > 1 else 1
        inputs = _trainer_inputs(config, arch)
        cp = inputs["context_parallel"]
        if shards % cp:
            refuse(
                "trainer.context_parallel",
                f"trainer.context_parallel={cp} must divide the trainer's {shards} device(s)",
            )
        budget = memory - TRAINER_RESERVE_BYTES
        if colocated and set(trainer_devices) & set(engine_devices):
            budget = int((1 - COLOCATED_GPU_SHARE) * memory) - TRAINER_RESERVE_BYTES
        parts = trainer_memory(arch, shards=shards, **inputs)
        if parts["total"] > budget:
            options = _alternatives(config, arch, inputs, shards, len(free))
            fitting = [
                (key, value)
                for key, value, changed, degree in options
                if trainer_memory(arch, shards=degree, **changed)["total"] <= budget
            ]
            biggest = max((k for k in parts if k != "total"), key=lambda k: parts[k])
            if fitting:
                key, value = fitting[0]
                hint = f"set {key}={value} (that alone fits)"
            else:
                by_part = {
                    "parameters": "trainer.fsdp",
                    "gradients": "trainer.fsdp",
                    "optimizer": "trainer.fsdp",
                    "autocast_copies": "trainer.fsdp",
                    "activations": "trainer.micro_batch_tokens",
                    "attention_mask": "agent.max_context_tokens",
                    "logits": "trainer.micro_batch_tokens",
                }
                key = by_part[biggest]
                context = config.agent.max_context_tokens
                if key == "trainer.micro_batch_tokens" and inputs["tokens"] <= context:
                    key = "agent.max_context_tokens"  # one sequence is the whole pass
                if key == "trainer.fsdp" and len(free) <= shards:
                    key = "trainer.lora.enabled"  # no more devices to shard over
                elif key == "trainer.fsdp" and backend == "ray_fsdp":
                    key = "cluster.trainer_workers"
                tried = ", ".join(k for k, *_ in options) or "no key"
                hint = (
                    f"change {key} ({biggest.replace('_', ' ')} is the largest part, and no "
                    f"single change of {tried} makes it fit alone)"
                )
            refuse(
                key,
                f"a trainer device needs {_gib(parts['total'])} GiB and has "
                f"{_gib(budget)} GiB ({'after the engine share, ' if budget < memory / 2 else ''}"
                f"less {_gib(TRAINER_RESERVE_BYTES)} GiB reserve): {biggest} "
                f"{_gib(parts[biggest])} GiB at {inputs['tokens']} tokens a pass over "
                f"{shards} shard(s); {hint}",
            )
        trainer_part = {
            "where": where,
            "backend": backend,
            "devices": trainer_devices,
            "shards": shards,
            "tokens_per_pass": inputs["tokens"],
            "context_parallel": cp,
            "dtype": "float32 weights and AdamW state"
            + (", bf16 autocast" if inputs["autocast"] else ""),
            "gradient_checkpointing": inputs["checkpointing"],
            "logits_chunk_tokens": inputs["logits_chunk_tokens"],
            "per_device_gib": {k: _gib(v) for k, v in parts.items()},
            "budget_gib": _gib(budget),
        }

    # --- devices -------------------------------------------------------------------------
    table: list[dict[str, Any]] = []
    for device in range(devices):
        roles = []
        used = 0.0
        if trainer_part and device in trainer_part["devices"]:
            roles.append("trainer")
            used += trainer_part["per_device_gib"]["total"] + _gib(TRAINER_RESERVE_BYTES)
        if engine_part and device in engine_part["devices"]:
            roles.append("engine")
            used += engine_part["budget_gib"]  # vLLM takes its whole share
        if roles:
            table.append(
                {
                    "device": device,
                    "node": device // per_node,
                    "roles": roles,
                    "gib": round(used, 2),
                }
            )
    return {
        "fits": not refusals,
        "model": {
            "path": config.model.path,
            "architecture": source,
            "parameters": arch.parameters(),
        },
        "hardware": {
            "nodes": hardware.nodes,
            "gpus_per_node": hardware.gpus_per_node,
            "gpu_memory_gib": hardware.gpu_memory_gib,
            "devices": devices,
        },
        "trainer": trainer_part,
        "engine": engine_part,
        "devices": table,
        "refusals": refusals,
    }


def render(report: dict[str, Any]) -> list[str]:
    """The plan as console lines; the last one says whether it fits."""
    hw, model = report["hardware"], report["model"]
    lines = [
        f"model {model['path'] or 'embedded'}: {model['parameters'] / 1e9:.2f} B parameters "
        f"({model['architecture']})",
        f"hardware: {hw['nodes']} node(s) x {hw['gpus_per_node']} GPUs of "
        f"{hw['gpu_memory_gib']:g} GiB",
    ]
    for role in ("trainer", "engine"):
        part = report[role]
        if part is None:
            lines.append(f"{role}: not on these devices")
            continue
        parts = ", ".join(f"{k} {v:g}" for k, v in part["per_device_gib"].items())
        lines.append(
            f"{role}: devices {_ranges(part['devices'])} ({part['where']}); per device GiB: "
            f"{parts}; budget {part['budget_gib']:g}"
        )
    for refusal in report["refusals"]:
        lines.append(f"refused [{refusal['key']}]: {refusal['message']}")
    lines.append(
        "fits" if report["fits"] else f"does not fit: change {report['refusals'][0]['key']}"
    )
    return lines


def _ranges(devices: list[int]) -> str:
    if not devices:
        return "none"
    if devices == list(range(devices[0], devices[-1] + 1)) and len(devices) > 1:
        return f"{devices[0]}-{devices[-1]}"
    return ",".join(str(d) for d in devices)


def local_gpus() -> Hardware | None:
    """This machine's GPUs as one node (None without CUDA or torch)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    smallest = min(torch.cuda.get_device_properties(i).total_memory for i in range(count))
    return Hardware(nodes=1, gpus_per_node=count, gpu_memory_gib=smallest / GIB)


def check_gpu_fit(config: ConveyorConfig) -> None:
    """`conveyor train`'s plan check: raise `ConfigError` with the plan's refusal when the
    trainer trains on this machine's GPU and the plan says it cannot fit. Nothing happens on
    CPU, for a trainer elsewhere (a service, Ray workers) or a model whose shape is unknown
    (the model check later says why)."""
    from conveyor.models import ModelError

    if config.trainer.device == "cpu" or config.trainer.backend.name != "builtin":
        return
    if config.cluster.address is not None:
        return
    hardware = local_gpus()
    if hardware is None:
        return
    try:
        report = plan_memory(config, hardware)
    except ModelError:
        return
    if not report["fits"]:
        first = report["refusals"][0]
        raise ConfigError(
            f"{first['key']}: the run does not fit this machine's {hardware.gpus_per_node} "
            f"GPU(s) of {hardware.gpu_memory_gib:.0f} GiB: {first['message']} "
            "(`conveyor plan` shows the whole plan)"
        )
