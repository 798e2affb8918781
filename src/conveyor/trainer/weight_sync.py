"""A weight sync that proves it took: after each update the engine's fingerprint must match.

`checked_sync(engine, backend, probe_ids)` returns a `WeightSync` (the callable `RLLoop` takes)
that has the backend load its weights into the engine (`TrainingBackend.sync_to`), asks the
engine what it now serves
(`WeightReceiver.weight_fingerprint`) and compares that with what the trainer computes for its
own weights (`FingerprintedBackend.weight_fingerprint`). Any difference raises `WeightSyncError`:
the loop stops instead of training on samples from weights it did not mean to serve.

The fingerprint has two parts, because neither alone covers every case:
1. Exact digests (blake2b of the raw bytes) of the tensors the engine keeps readable after
   loading: on vLLM CPU the token embedding and every norm (its Linear weights are re-packed
   for the GEMM kernels and read back empty). Full fine-tuning changes all of them every step,
   so a skipped or partial load of them is caught bit-exactly, however small the step.
2. The temperature-1 logprobs of a fixed probe sequence (`PROBE_TEXT`), as the engine serves
   them and as the trainer computes them (in float32), within `tolerance`. This covers the
   weights digests cannot see: the packed Linear weights, and LoRA, whose merged export leaves
   embedding and norms untouched. Measured here (SmolLM2-135M, vLLM CPU float32 vs the trainer):
   numeric noise max 3.7e-5 over 40 probe tokens, while one step at lr 1e-6 (full) or 1e-5
   (LoRA r=16) moves the probe by up to 3.5e-3.

Engine replicas behind a router (`conveyor.engines.router`) are checked one by one
(`ReplicaFingerprints`): the trainer's fingerprint is computed once and every replica's must
match it, so a sync passes only when every replica serves the new version.

Blind spots: an update that moves no digested tensor (LoRA) and moves the probe by less than
`tolerance` is not told apart from a skipped one; such an update changes the served function on
the probe by at most `tolerance` anyway. A bfloat16/float16 engine differs from the float32
trainer by more than one small step moves the probe, so there the probe only catches gross
failures (a wrong model, weights not loaded) and a skipped LoRA sync can pass; the digests are
still exact. Fused engine tensors (vLLM's `qkv_proj` on GPU) have no trainer-side name and are
not digested.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from conveyor.engines.base import ReplicaFingerprints, ServesFingerprint, WeightFingerprint
from conveyor.trainer.backend import FingerprintedBackend
from conveyor.trainer.loop import WeightSync

# Natural text with code and digits, so the probe covers peaked and flat next-token
# distributions; any fixed text would do.
PROBE_TEXT = (
    "The quick brown fox jumps over the lazy dog. Weight sync check: 1, 2, 3, 4, 5.\n"
    "def add(a, b):\n    return a + b\n"
)

# Largest |engine - trainer| probe logprob accepted, by the dtype the engine holds weights in.
DEFAULT_TOLERANCE = {"float32": 5e-4, "bfloat16": 0.1, "float16": 0.05}


class WeightSyncError(RuntimeError):
    """The engine does not serve the weights the trainer just sent it (never trained on)."""


def probe_ids(tokenizer: Any) -> list[int]:
    """`PROBE_TEXT` in the model's tokens (no special tokens)."""
    ids: list[int] = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    return ids


def checked_sync(
    engine: Any,
    backend: Any,
    probe: Sequence[int],
    *,
    tolerance: float | None = None,
) -> WeightSync:
    """A `WeightSync` that updates `engine` and raises `WeightSyncError` unless it took.

    `tolerance` bounds the probe logprob difference; None picks it by the engine's dtype
    (`DEFAULT_TOLERANCE`). The seconds returned cover the update and the check.
    """
    if not isinstance(engine, ServesFingerprint):
        raise WeightSyncError(
            f"{type(engine).__name__} cannot report the weights it serves (no "
            "weight_fingerprint); a checked weight sync needs an engine that can"
        )
    fingerprinter: object = backend  # narrowed alone: `backend` stays the training backend
    if not isinstance(fingerprinter, FingerprintedBackend):
        raise WeightSyncError(f"{type(backend).__name__} cannot fingerprint its weights")
    if len(probe) < 2:
        raise ValueError("the weight probe needs at least two tokens")
    ids = list(probe)

    async def sync(step: int = 0) -> float:
        start = time.perf_counter()
        version = backend.policy_version
        await backend.sync_to(engine, step=step)
        if isinstance(engine, ReplicaFingerprints):
            # replicas behind a router: every one must serve the new weights
            served = await engine.replica_fingerprints(ids)
        else:
            served = [("", await engine.weight_fingerprint(ids))]
        # one trainer-side fingerprint: the replicas are one engine kind, holding one layout
        expected = await asyncio.to_thread(fingerprinter.weight_fingerprint, served[0][1], ids)
        for name, fingerprint in served:
            check_fingerprint(fingerprint, expected, version, tolerance, replica=name)
        return time.perf_counter() - start

    return sync


def check_fingerprint(
    served: WeightFingerprint,
    expected: WeightFingerprint,
    version: int,
    tolerance: float | None = None,
    *,
    replica: str = "",
) -> None:
    """Raise `WeightSyncError` naming every way `served` differs from `expected` (and the
    engine `replica` it came from, when one is named)."""
    problems: list[str] = []
    if served.policy_version != version:
        problems.append(f"the engine reports policy version {served.policy_version}, not {version}")
    common = sorted(set(served.digests) & set(expected.digests))
    shape = [n for n in common if served.shapes.get(n) != expected.shapes.get(n)]
    differ = [n for n in common if n not in shape and served.digests[n] != expected.digests[n]]
    if shape:
        problems.append(f"{len(shape)} tensors have other shapes in the engine, e.g. {shape[:3]}")
    if differ:
        problems.append(
            f"{len(differ)} of {len(common)} digested tensors differ from the trainer's, "
            f"e.g. {differ[:3]}"
        )
    if len(served.probe_logprobs) != len(expected.probe_logprobs):
        problems.append(
            f"the engine scored {len(served.probe_logprobs)} probe tokens, the trainer "
            f"{len(expected.probe_logprobs)}"
        )
    elif served.probe_logprobs:
        limit = tolerance if tolerance is not None else _tolerance(served)
        worst = max(
            abs(a - b)
            for a, b in zip(served.probe_logprobs[1:], expected.probe_logprobs[1:], strict=True)
        )
        if worst > limit:
            problems.append(f"probe logprobs differ by up to {worst:.3g} (tolerance {limit:g})")
    if not common and not served.probe_logprobs:
        problems.append("nothing to compare: no digested tensor in common and no probe")
    if problems:
        where = f" on engine replica {replica}" if replica else ""
        raise WeightSyncError(
            f"weight sync to policy version {version} did not take{where}: " + "; ".join(problems)
        )


def _tolerance(served: WeightFingerprint) -> float:
    # the loosest dtype the engine holds any digested tensor in decides
    dtypes = set(served.dtypes.values()) or {"float32"}
    return max(DEFAULT_TOLERANCE.get(d, max(DEFAULT_TOLERANCE.values())) for d in dtypes)
