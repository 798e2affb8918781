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


def check_tensor_parallel(size: int, gpu: bool) -> None:
    """Refuse `engine.tensor_parallel_size` > 1 without a GPU, before vLLM loads anything."""
    if size > 1 and not gpu:
        from conveyor.engines.base import EngineError

        raise EngineError(
            f"engine.tensor_parallel_size={size} spreads the engine over {size} GPUs, and this "
            "machine has none (vLLM on CPU runs one rank); set engine.tensor_parallel_size=1"
        )
