"""Atomic, resumable checkpoints of a training backend plus the loop's own state.

Layout of a run folder:

```
RUN_DIR/checkpoints/step_000002/
    model.safetensors | adapter.safetensors   weights (full model, or LoRA adapter only)
    optimizer.pt, scheduler.pt                torch state dicts (tensors and numbers only)
    trainer_state.json                        policy version, tied-weight aliases
    rng_rank0.json                            python, numpy and torch (and CUDA) RNG states
    extra.json                                the loop's JSON-able state: data cursor, metrics ...
    checkpoint.json                           written last: step and file list
```

`save_checkpoint` writes into `checkpoints/.tmp-step_N`, then renames it to `step_N` with
`os.replace`, so a crash at any point leaves earlier checkpoints untouched and never a
half-written `step_N`; the next save clears a stale temp folder. `latest_checkpoint` only
considers renamed folders with their `checkpoint.json`.

Model and optimizer states go through `torch.distributed.checkpoint.state_dict` with full state
dicts, so one code path serves a plain module and an FSDP2-sharded one (rank 0 writes; every
rank reads the files on load, which assumes a file system they share).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from conveyor.trainer.backend import TrainingBackend
from conveyor.trainer.faults import kill_point
from conveyor.trainer.fsdp import world

CHECKPOINTS = "checkpoints"
MARKER = "checkpoint.json"
_PREFIX = "step_"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of `step` lives."""
    return Path(run_dir) / CHECKPOINTS / f"{_PREFIX}{step:06d}"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as (step, folder), oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        suffix = child.name.removeprefix(_PREFIX)
        if child.name.startswith(_PREFIX) and suffix.isdigit() and (child / MARKER).is_file():
            found.append((int(suffix), child))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint folder of a run, or None."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def save_checkpoint(
    run_dir: Path,
    step: int,
    backend: TrainingBackend,
    extra: dict[str, Any] | None = None,
    *,
    keep_last: int | None = 3,
) -> Path:
    """Atomically write `backend`'s state, RNG states and `extra` as the checkpoint of `step`.

    Collective under several ranks (call it on all). Keeps the newest `keep_last` checkpoints
    (None keeps all). Returns the final folder.
    """
    rank, world_size = world()
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(f".tmp-{final.name}")
    if rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)  # left by a crash
        tmp.mkdir(parents=True)
    _barrier(world_size)
    try:
        backend.save(tmp)
        _write_json(tmp / f"rng_rank{rank}.json", capture_rng_state())
        _barrier(world_size)
        if rank == 0:
            _write_json(tmp / "extra.json", extra or {})
            files = sorted(p.name for p in tmp.iterdir())
            _write_json(tmp / MARKER, {"step": step, "files": [*files, MARKER]})
            _fsync_tree(tmp)
            kill_point("checkpoint_write", step)
            _replace_dir(tmp, final)
            if keep_last is not None:
                for _, old in list_checkpoints(run_dir)[:-keep_last]:
                    shutil.rmtree(old)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _barrier(world_size)
    return final


def load_checkpoint(path: Path, backend: TrainingBackend) -> dict[str, Any]:
    """Restore `backend` and this rank's RNG states from a checkpoint; returns its `extra`."""
    path = Path(path)
    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER})")
    backend.load(path)
    rank, _ = world()
    restore_rng_state(json.loads((path / f"rng_rank{rank}.json").read_text()))
    extra: dict[str, Any] = json.loads((path / "extra.json").read_text())
    return extra


# -- RNG -----------------------------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and CUDA generator states as JSON-able values."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


# -- model, optimizer, scheduler -----------------------------------------------------------------


def write_training_state(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    trainable_only: bool,
    state: dict[str, Any],
) -> None:
    """Write weights (all, or only trainable ones: a LoRA adapter), optimizer and scheduler.

    Collective under FSDP (full state dicts are gathered); only rank 0 writes.
    """
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only
    )
    weights = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
    optim = get_optimizer_state_dict(model, optimizer, options=options)
    if world()[0] != 0:
        return
    # safetensors refuses shared storage (tied embeddings): store each tensor once, note aliases
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, tuple[int, ...]], str] = {}
    for name, tensor in weights.items():
        key = (tensor.untyped_storage().data_ptr(), tuple(tensor.shape))
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        unique[name] = tensor.detach().contiguous()
    save_file(unique, str(path / _weights_file(trainable_only)))
    torch.save(optim, path / "optimizer.pt")
    torch.save(scheduler.state_dict(), path / "scheduler.pt")
    _write_json(path / "trainer_state.json", {**state, "aliases": aliases})


def read_training_state(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    trainable_only: bool,
) -> dict[str, Any]:
    """Load what `write_training_state` wrote; returns its `state` dict."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state: dict[str, Any] = json.loads((path / "trainer_state.json").read_text())
    weights_file = path / _weights_file(trainable_only)
    if not weights_file.is_file():
        raise FileNotFoundError(
            f"{weights_file} is missing: was the checkpoint written with lora "
            f"{'disabled' if trainable_only else 'enabled'}?"
        )
    weights: dict[str, Any] = load_file(str(weights_file))
    for name, target in state.get("aliases", {}).items():
        weights[name] = weights[target]
    options = StateDictOptions(full_state_dict=True, strict=not trainable_only)
    set_model_state_dict(model, weights, options=options)
    optim = torch.load(path / "optimizer.pt", weights_only=True)
    set_optimizer_state_dict(model, optimizer, optim, options=options)
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    return state


def _weights_file(trainable_only: bool) -> str:
    return "adapter.safetensors" if trainable_only else "model.safetensors"


# -- files ---------------------------------------------------------------------------------------


def _write_json(path: Path, value: Any) -> None:
    with open(path, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())


def _fsync_tree(folder: Path) -> None:
    for child in folder.iterdir():
        with open(child, "rb") as f:
            os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`; an existing `dst` (the same step saved again) is moved aside first."""
    if dst.exists():
        aside = dst.with_name(f".old-{dst.name}")
        if aside.exists():
            shutil.rmtree(aside)
        os.replace(dst, aside)
        os.replace(src, dst)
        shutil.rmtree(aside)
    else:
        os.replace(src, dst)
    _fsync_dir(dst.parent)


def _barrier(world_size: int) -> None:
    if world_size > 1:
        dist.barrier()
