"""An engine's memory on each of its devices (`conveyor plan`): standard library only.

vLLM on a GPU takes a fixed share of each device it runs on (`gpu_memory_utilization`): its
weights (divided by the tensor-parallel degree), a runtime reserve, and whatever is left of the
share as KV cache. A plan fits the engine when the share holds the weights, the reserve and the
KV cache the config asks for: `engine.kv_cache_gib` when the config sets it, else room for
`engine.max_num_seqs` sequences of `agent.max_context_tokens` each.

The shares are the ones the engines are started with: `COLOCATED_GPU_SHARE` for the in-process
engine (`vllm_local`), which shares its device with the trainer's first device, and
`REPLICA_GPU_SHARE` for a replica server on devices of its own (`vllm_replicas`, `ray_replicas`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

GIB = 2**30

COLOCATED_GPU_SHARE = 0.5
REPLICA_GPU_SHARE = 0.85
# vLLM's own activations (the profile run), the sampler and the CUDA context, per device:
# assumed, not measured (no vLLM on the GPU machine this project is lent)
RUNTIME_RESERVE_BYTES = 2 * GIB


def engine_memory(
    parameters: int,
    kv_bytes_per_token: int,
    *,
    weight_bytes: int,
    tensor_parallel: int,
    kv_cache_bytes: int | None,
    max_num_seqs: int,
    max_context_tokens: int,
    share_bytes: int,
) -> dict[str, Any]:
    """Bytes one engine device needs, by component, and what its share leaves for KV cache.

    `kv_cache_bytes` is the replica's KV cache when the config gives one (None: room for
    `max_num_seqs` x `max_context_tokens` tokens); both are split over the tensor-parallel
    ranks, as are the weights. `share_bytes` is what vLLM may take of the device.
    """
    if tensor_parallel <= 0:
        raise ValueError("tensor_parallel must be positive")
    weights = parameters * weight_bytes // tensor_parallel
    wanted = (
        kv_cache_bytes
        if kv_cache_bytes is not None
        else max_num_seqs * max_context_tokens * kv_bytes_per_token
    )
    kv = wanted // tensor_parallel
    available = max(0, share_bytes - weights - RUNTIME_RESERVE_BYTES)
    per_token = max(1, kv_bytes_per_token // tensor_parallel)
    return {
        "weights": weights,
        "kv_cache": kv,
        "runtime_reserve": RUNTIME_RESERVE_BYTES,
        "total": weights + kv + RUNTIME_RESERVE_BYTES,
        "share": share_bytes,
        "kv_available": available,
        "kv_tokens_available": available // per_token,
        "full_context_sequences": available // per_token // max(1, max_context_tokens),
    }


def eager_mode(cuda_graphs: bool | None, gpu: bool) -> bool:
    """vLLM's `enforce_eager` for `engine.cuda_graphs` on a host with (`gpu`) or without a
    GPU: null means graphs where a GPU is, eager on CPU; graphs asked for on CPU are refused."""
    if cuda_graphs and not gpu:
        from conveyor.engines.base import EngineError

        raise EngineError(
            "engine.cuda_graphs is true, but this engine's host has no GPU (vLLM on CPU runs "
            "eager); leave it null (graphs where a GPU is) or set it to false"
        )
    return not (gpu if cuda_graphs is None else cuda_graphs)


def check_tensor_parallel(size: int, gpu: bool) -> None:
    """Refuse a replica server with `engine.tensor_parallel_size` > 1 without a GPU, before vLLM
    loads anything (on CPU only the in-process engine runs ranks: `cpu_tensor_parallel`)."""
    if size > 1 and not gpu:
        from conveyor.engines.base import EngineError

        raise EngineError(
            f"engine.tensor_parallel_size={size} on replica servers needs GPUs, and this machine "
            "has none (on CPU only the in-process engine, engine.replicas=1, runs tensor-parallel "
            "ranks); set engine.tensor_parallel_size=1 or engine.replicas=1"
        )


def cpu_thread_binding(size: int, cores: Sequence[int]) -> str:
    """vLLM-CPU's `VLLM_CPU_OMP_THREADS_BIND` for `size` ranks: `cores` (those this process may
    run on) split into `size` contiguous groups, the first ones one core larger when they do not
    divide, e.g. cores 0-3, 2 ranks: "0,1|2,3". Refuses fewer cores than ranks."""
    from conveyor.engines.base import EngineError

    ordered = sorted(set(cores))
    if size > len(ordered):
        raise EngineError(
            f"engine.tensor_parallel_size={size} on CPU needs a core per rank and this process "
            f"may use {len(ordered)} ({_ranges(ordered)}); lower engine.tensor_parallel_size"
        )
    share, extra = divmod(len(ordered), size)
    groups: list[str] = []
    start = 0
    for rank in range(size):
        end = start + share + (1 if rank < extra else 0)
        groups.append(",".join(str(c) for c in ordered[start:end]))
        start = end
    return "|".join(groups)


def check_heads_divide(model_config: dict[str, Any], size: int) -> None:
    """Refuse a tensor-parallel degree that does not divide the model's attention heads (vLLM
    splits the heads over the ranks; key-value heads may be fewer and are then replicated)."""
    from conveyor.engines.base import EngineError

    heads = int(model_config.get("num_attention_heads") or 0)
    kv = int(model_config.get("num_key_value_heads") or heads)
    if heads and heads % size:
        raise EngineError(
            f"engine.tensor_parallel_size={size} does not divide the model's {heads} attention "
            "heads (vLLM gives each rank the same number); pick a divisor of it"
        )
    if kv and kv % size and size % kv:
        raise EngineError(
            f"engine.tensor_parallel_size={size} neither divides nor is a multiple of the "
            f"model's {kv} key-value heads; pick a divisor of it"
        )


def _ranges(cores: Sequence[int]) -> str:
    return ",".join(str(c) for c in cores) or "none"
