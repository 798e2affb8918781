"""Load a Hugging Face causal LM straight into FSDP2 shards: no rank ever holds the whole model.

The full-load path (`from_pretrained`, then `fully_shard`) puts a whole float32 copy of the
model on every rank before sharding it (a 32B model: 128 GB a rank). Under `trainer.fsdp` the
built-in trainer instead

1. builds the model from its `config.json` with every parameter on the meta device
   (`parameters_on_meta`: no storage, no initialisation) while buffers are computed for real
   as the model's constructor makes them (the rotary `inv_freq` tables, which are not in the
   checkpoint), and ties the embeddings as `from_pretrained` does;
2. shards it with `fully_shard` (`conveyor.trainer.fsdp.shard_model`): each parameter becomes a
   DTensor whose local part is this rank's rows, still on the meta device;
3. `load_local_shards`: `to_empty` gives the local parts storage on the training device
   (buffers are saved before and restored after, since `to_empty` blanks them too), then each
   rank reads only its rows of each tensor from the safetensors files into its local part
   (`_RowReader`: the file's header says where a tensor's bytes are; FSDP shards whole rows,
   so a rank's part is one contiguous byte range, read with `readinto` straight into the
   shard, cast to float32 through a row buffer where the file holds another dtype). Not a
   memory map: the pages a map touches count in the resident size while it is open (one
   rank of two measured 724 MiB above its start that way, against 770 MiB for the full-load
   path's floor).

A tied LM head is one parameter (the embedding's) and is loaded once, under whichever of its
names the checkpoint holds. tests/trainer/test_sharded_load.py checks, on two gloo ranks with
the embedded model, that the gathered parameters and buffers equal `from_pretrained`'s, that a
train step's loss equals the full-load path's, and each rank's peak resident memory.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "build_on_meta",
    "load_local_shards",
    "parameters_on_meta",
    "safetensors_index",
]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def safetensors_index(model_dir: Path | str) -> dict[str, Path] | None:
    """{tensor name: the safetensors file holding it} of a Hugging Face folder: from
    `model.safetensors.index.json` (a checkpoint in several files) or the one
    `model.safetensors`; None when the folder has neither (a `.bin` checkpoint)."""
    folder = Path(model_dir)
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {str(name): folder / str(file) for name, file in weight_map.items()}
    single = folder / SINGLE_FILE
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt", device="cpu") as handle:
            return dict.fromkeys(handle.keys(), single)
    return None


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Within it, every parameter a module registers is moved to the meta device as it is
    registered (so its initialisation, which runs after, costs nothing), while buffers stay
    where they are made. The constructor's `torch.empty` for a parameter allocates pages it
    never touches, then frees them."""
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            moved = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
            moved.__dict__.update(param.__dict__)
            param = moved
        register(module, name, param)

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def build_on_meta(model_dir: Path | str, dtype: torch.dtype = torch.float32) -> Any:
    """The causal LM of `model_dir`'s config.json, parameters on the meta device, buffers real,
    tied weights tied (the model's `post_init` ties them)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def _checkpoint_names(model: nn.Module) -> dict[int, list[str]]:
    """Every name each parameter object goes by (a tied head has two), by `id`."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return names


def _find(names: list[str], index: dict[str, Path], prefix: str) -> str | None:
    """The first of `names` the checkpoint holds, also trying them without or with the
    model's base prefix (a checkpoint saved from the bare decoder)."""
    candidates = list(names)
    if prefix:
        for name in names:
            if name.startswith(prefix + "."):
                candidates.append(name[len(prefix) + 1 :])
            else:
                candidates.append(f"{prefix}.{name}")
    return next((c for c in candidates if c in index), None)


_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class _RowReader:
    """Reads row ranges of a safetensors file's tensors with plain `readinto`, straight into
    the destination's memory where it can. A memory map (`safe_open`) would do too, but every
    page it touches counts in the process's resident size for as long as the file is open:
    this way a rank's resident size grows by its shard alone."""

    def __init__(self, path: Path) -> None:
        import struct

        self.file = path.open("rb")
        (size,) = struct.unpack("<Q", self.file.read(8))
        self.header: dict[str, Any] = json.loads(self.file.read(size))
        self.data_start = 8 + size

    def can_read(self, key: str) -> bool:
        entry = self.header.get(key)
        return isinstance(entry, dict) and entry.get("dtype") in _DTYPES

    def read_rows(self, key: str, start: int, out: torch.Tensor) -> None:
        """Rows `start : start + len(out)` of tensor `key` into `out` (cast if needed)."""
        entry = self.header[key]
        dtype = _DTYPES[entry["dtype"]]
        shape = [int(d) for d in entry["shape"]]
        row_bytes = math.prod(shape[1:]) * torch.empty((), dtype=dtype).element_size()
        direct = out.dtype == dtype and out.device.type == "cpu" and out.is_contiguous()
        target = out if direct else torch.empty(tuple(out.shape), dtype=dtype)
        view = memoryview(target.view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]
        self.file.seek(self.data_start + int(entry["data_offsets"][0]) + start * row_bytes)
        done = 0
        while done < len(view):
            n = self.file.readinto(view[done:])
            if not n:
                raise ValueError(f"{self.file.name}: {key} ends early")
            done += n
        if not direct:
            out.copy_(target)

    def close(self) -> None:
        self.file.close()


def _retie(model: nn.Module, groups: list[list[str]]) -> None:
    """Make each group of names one parameter object again: `to_empty` gives every module
    its own new parameter where it cannot swap in place (a plain tensor leaving meta)."""
    for names in groups:
        first = model.get_parameter(names[0])
        for name in names[1:]:
            if model.get_parameter(name) is not first:
                owner, _, attribute = name.rpartition(".")
                setattr(model.get_submodule(owner), attribute, first)


def load_local_shards(model: nn.Module, model_dir: Path | str, device: torch.device) -> None:
    """Give a meta-device model (sharded with `fully_shard`, or not) storage on `device` and
    fill each parameter's local part with its rows from `model_dir`'s safetensors files.

    A DTensor parameter gets only its local rows (`compute_local_shape_and_global_offset`); a
    plain one (not sharded) the whole tensor. Buffers made for real by the constructor keep
    their values; a meta buffer must be in the checkpoint. Raises ValueError naming a
    parameter the checkpoint lacks or holds with another shape.
    """
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    index = safetensors_index(model_dir)
    if index is None:
        raise ValueError(f"{model_dir} has no {SINGLE_FILE} or {INDEX_FILE} to load shards from")
    kept = {
        name: buffer.detach().clone()
        for name, buffer in model.named_buffers()
        if buffer.device.type != "meta"
    }
    meta_buffers = {name for name, buffer in model.named_buffers() if buffer.device.type == "meta"}
    aliases = _checkpoint_names(model)
    prefix = str(getattr(model, "base_model_prefix", "") or "")

    keys: dict[str, str] = {}  # parameter name -> checkpoint name
    for name, param in model.named_parameters():
        key = _find(aliases[id(param)], index, prefix)
        if key is None:
            raise ValueError(
                f"{model_dir}: the checkpoint has no tensor for parameter {name!r} "
                f"(looked for {aliases[id(param)]}); it cannot be loaded shard by shard"
            )
        keys[name] = key
    buffer_keys = {name: _find([name], index, prefix) for name in meta_buffers}
    missing = sorted(name for name, key in buffer_keys.items() if key is None)
    if missing:
        raise ValueError(
            f"{model_dir}: buffers {missing} are neither computed by the model nor in the "
            "checkpoint"
        )

    model.to_empty(device=device)
    _retie(model, [names for names in aliases.values() if len(names) > 1])
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name in kept:
                buffer.copy_(kept[name])
    del kept

    with contextlib.ExitStack() as stack, torch.no_grad():
        handles: dict[Path, Any] = {}
        readers: dict[Path, _RowReader] = {}

        def handle(path: Path) -> Any:
            if path not in handles:
                handles[path] = stack.enter_context(
                    safe_open(str(path), framework="pt", device="cpu")
                )
            return handles[path]

        def reader(path: Path) -> _RowReader:
            if path not in readers:
                readers[path] = _RowReader(path)
                stack.callback(readers[path].close)
            return readers[path]

        # `to_empty` may have replaced the parameter objects: look them up again by name
        for name, param in model.named_parameters():
            key = keys[name]
            rows_reader = reader(index[key])
            stored = rows_reader.header.get(key, {}).get("shape")
            if stored != list(param.shape):
                raise ValueError(
                    f"{model_dir}: {key} has shape {stored} in the checkpoint, the model's "
                    f"{name} {list(param.shape)}"
                )
            if isinstance(param, DTensor):
                local = param.to_local()
                shape, offset = compute_local_shape_and_global_offset(
                    param.shape, param.device_mesh, param.placements
                )
                if tuple(local.shape) != tuple(shape):
                    raise RuntimeError(
                        f"{name}: local shard {tuple(local.shape)}, DTensor says {tuple(shape)}"
                    )
            else:
                local, shape, offset = param, tuple(param.shape), (0,) * param.dim()
            if local.numel() == 0:
                continue
            whole_rows = all(
                o == 0 and s == d
                for o, s, d in zip(offset[1:], shape[1:], param.shape[1:], strict=True)
            )
            if local.dim() > 0 and whole_rows and rows_reader.can_read(key):
                rows_reader.read_rows(key, offset[0], local)  # FSDP's Shard(0): whole rows
                continue
            rows = tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))
            source = handle(index[key]).get_slice(key)
            local.copy_(source[rows] if rows else handle(index[key]).get_tensor(key))
        for name, key in buffer_keys.items():
            assert key is not None
            model.get_buffer(name).copy_(handle(index[key]).get_tensor(key))
