"""FSDP2 sharding of a causal LM over the initialised `torch.distributed` process group.

Each decoder layer becomes its own FSDP unit (parameters all-gathered just before the layer
runs and freed after), and the root module holds the rest (embeddings, final norm, LM head,
which stay one unit so tied embeddings share one sharded parameter). Decoder layers are found by
the class names the model lists in `_no_split_modules` (Hugging Face models declare them), so
this works through a peft wrapper too.

Gradients are reduce-scattered with FSDP's default averaging over ranks; the engine scales each
rank's loss by the world size, so the update equals a single-process step on the whole batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group, or (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def decoder_layer_names(model: nn.Module) -> set[str]:
    """Class names of the model's repeated blocks, from `_no_split_modules`."""
    for module in model.modules():
        names = getattr(module, "_no_split_modules", None)
        if names:
            return set(names)
    raise ValueError(
        f"{type(model).__name__} declares no _no_split_modules; cannot find its decoder layers"
    )


def shard_model(model: nn.Module, device: torch.device) -> nn.Module:
    """Apply FSDP2 `fully_shard` to every decoder layer, then to the root; returns `model`.

    Needs an initialised process group. On CPU, gloo carries the collectives (tests); on GPUs,
    NCCL. The optimizer must be built after this (it holds the sharded parameters).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "fsdp: true needs torch.distributed initialised (torchrun, or init_process_group)"
        )
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    layer_names = decoder_layer_names(model)
    layers = [m for m in model.modules() if type(m).__name__ in layer_names]
    if not layers:
        raise ValueError(f"no module of {sorted(layer_names)} found in {type(model).__name__}")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The unsharded value of a (possibly DTensor) tensor; collective for a DTensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        return tensor.full_tensor()
    return tensor


def all_reduce_floats(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    """Sum (or max) a few floats over all ranks; the identity without a process group.

    `device` is where the backend can reduce (CUDA for NCCL, CPU for gloo).
    """
    if world()[1] == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return [float(v) for v in tensor.tolist()]
