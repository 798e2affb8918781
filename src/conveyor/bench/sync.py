"""`conveyor bench sync`: seconds to move the trainer's weights into a vLLM engine, by the
collective broadcast and by the safetensors fallback, on the same weights in the same run.

The engine is a dev-mode vLLM server with the weight-group extension: one this command starts
(`engine.replicas`' code path, `conveyor.engines.vllm_replicas`) or one already running at
`--base-url`. The weights are the model's own, loaded by the built-in trainer
(`TorchTrainingEngine.export_weights`, what `conveyor train` sends). Each path syncs once
unmeasured (the collective one opens its group there: `collective_first_s`), then `rounds`
times each, alternating and with the order swapped every round, so drift in machine load hits
both. Every measured sync is followed (outside the timing) by the fingerprint check that
training runs, which catches a wrong or half-loaded model; the weights are the same every
time, so a sync that loads nothing is not told apart here (tests/engines/
test_vllm_server_sync.py proves both paths load, version after version).

`--tensor-parallel N` measures the collective path into an in-process engine of N ranks instead
(on CPU, a model whose heads N divides: `--model tiny-qwen3`, the `builtin:tiny-qwen3` model
of conveyor.models); the safetensors path cannot reach worker processes and reports null.

The figures are `update_weights`' own: for safetensors, writing the folder, the server's reload
and the prefix-cache reset; for collectives, the broadcast and the reload, and the same reset.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

PATHS = ("collective", "safetensors")


async def measure_sync(
    engine: Any, backend: Any, probe: list[int], rounds: int, paths: tuple[str, ...] = PATHS
) -> dict[str, Any]:
    """Sync `backend`'s weights into `engine` (a `VLLMServerEngine` or `VLLMEngine`) by each of
    `paths`, `rounds` times each with the order rotated; medians (None for a path not measured)
    and every figure."""
    from conveyor.trainer.weight_sync import check_fingerprint

    times: dict[str, list[float]] = {path: [] for path in PATHS}
    version = engine.policy_version
    first: dict[str, float] = {}
    expected: Any = None  # the trainer's fingerprint: its weights do not change in between

    async def one(path: str) -> float:
        nonlocal version
        engine.weight_sync = path
        version += 1
        seconds: float = await engine.update_weights(backend.export_weights(), version)
        used = getattr(engine, "weight_sync_used", path) or path
        if used != path:
            raise RuntimeError(f"asked for a {path} sync, the engine synced by {used}")
        nonlocal expected
        served = await engine.weight_fingerprint(probe)
        if expected is None:
            expected = await asyncio.to_thread(backend.weight_fingerprint, served, probe)
        check_fingerprint(served, expected.model_copy(update={"policy_version": version}), version)
        return seconds

    for path in paths:  # warm-up; the collective one opens the group
        first[path] = await one(path)
    for index in range(rounds):
        order = paths if index % 2 == 0 else tuple(reversed(paths))
        for path in order:
            times[path].append(await one(path))
    return {
        "collective_s": statistics.median(times["collective"]) if times["collective"] else None,
        "safetensors_s": statistics.median(times["safetensors"]) if times["safetensors"] else None,
        "collective_first_s": first["collective"],
        "rounds": rounds,
        "collective_all_s": times["collective"],
        "safetensors_all_s": times["safetensors"],
    }


def run_sync_bench(
    model_dir: Path, *, rounds: int, base_url: str | None, tensor_parallel: int = 1
) -> dict[str, Any]:
    """Start a server of `model_dir` (unless `base_url` names a running one) and measure; with
    `tensor_parallel` > 1 an in-process engine of that many ranks instead, collective only (its
    ranks live in worker processes, which only a collective sync reaches)."""
    from conveyor.config import TrainerConfig
    from conveyor.engines.factory import load_tokenizer
    from conveyor.engines.vllm_server import VLLMServerEngine
    from conveyor.trainer.engine import TorchTrainingEngine
    from conveyor.trainer.weight_sync import probe_ids

    start = time.perf_counter()
    backend = TorchTrainingEngine(model_dir, TrainerConfig(device="cpu"))
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    # a fixed sequence within the model's vocabulary (a tiny model may borrow a bigger tokenizer)
    probe = [i % vocab for i in probe_ids(load_tokenizer(model_dir))]
    paths: tuple[str, ...] = PATHS
    kind = "vllm server (dev mode, worker extension)"
    if tensor_parallel > 1:
        from conveyor.engines.vllm_local import VLLMEngine

        engine: Any = VLLMEngine(
            model_dir,
            max_num_seqs=4,
            max_model_len=1024,
            kv_cache_gib=1,
            tensor_parallel_size=tensor_parallel,
            weight_sync="collective",
        )
        paths = ("collective",)
        kind = f"in-process vllm, tensor parallel {tensor_parallel}"
    elif base_url is not None:
        engine = VLLMServerEngine(
            base_url, str(model_dir), source_dir=model_dir, weight_sync="collective"
        )
    else:
        from conveyor.engines.vllm_replicas import start_replicas

        (engine,) = start_replicas(
            model_dir,
            1,
            max_num_seqs=4,
            max_model_len=1024,
            kv_cache_gib=1,
            dtype="auto",
            seed=0,
            extra_args=[],
            client_options={},
            weight_sync="collective",
        )

    async def go() -> dict[str, Any]:
        try:
            return await measure_sync(engine, backend, probe, rounds, paths)
        finally:
            await engine.close()

    report = asyncio.run(go())
    tensors = list(backend.export_weights())
    report.update(
        engine=kind,
        tensor_parallel=tensor_parallel,
        weight_mb=round(sum(t.numel() * t.element_size() for _, t in tensors) / 2**20, 1),
        tensors=len(tensors),
        wall_s=round(time.perf_counter() - start, 1),
    )
    return report
