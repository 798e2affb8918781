"""The scale twin (`configs/scale-twin.yaml`, issue 31): the GPU recipes' code path at toy size
on CPU, two real RL steps, against a single-process run of the same config.

The twin: `conveyor train` on a tiny random Qwen3 (`model.path: builtin:tiny-qwen3`) with two
local FSDP2 trainer ranks over gloo, sequence packing, chunked logits and context parallel 2
(so dp 1 x cp 2: each rank holds half of every packed row), two vLLM-CPU replica servers behind
the router, weights into both by gloo broadcasts (`engine.weight_sync: collective`), the
fingerprint check after every sync (a sync that did not take stops the run). The reference: the
same config in one process (one trainer, padded rows, whole logits, the in-process vLLM taking
the tensors directly). Seeded sampling makes both sample the same tokens, so the two updates
see the same batches: the rollouts must be identical, the losses and gradient norms equal, the
final weights equal within float32 rounding while the updates moved them far more.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from run_records import records, rollouts

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs/scale-twin.yaml"
# The reference run: one trainer process, no context parallelism, right-padded micro-batches
# with whole logits, one in-process engine that takes the tensors directly.
SINGLE = [
    "trainer.fsdp=false",
    "trainer.fsdp_ranks=null",
    "trainer.context_parallel=1",
    "trainer.packing=false",
    "trainer.logits_chunk_tokens=null",
    "engine.replicas=1",
    "engine.weight_sync=safetensors",
]
ROLLOUTS = 2 * 2 * 2  # steps x tasks a step x group size
# |twin - reference| / |reference - base| over all final weights (float32; measured 6.1e-6)
UPDATE_TOLERANCE = 1e-4


def train(run_dir: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    args = [arg for item in (*sets, f"run.dir={run_dir}") for arg in ("--set", item)]
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "train", str(CONFIG), *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )


@pytest.mark.slow
def test_the_scale_twin_trains_two_steps_equal_to_a_single_process_run(
    tmp_path: Path, model_dir: Path
) -> None:
    from safetensors.torch import load_file

    from conveyor.models import TINY_QWEN3, resolve_model_path

    twin_dir, single_dir = tmp_path / "twin", tmp_path / "single"
    twin = train(twin_dir)
    assert twin.returncode == 0, twin.stderr[-4000:]
    single = train(single_dir, *SINGLE)
    assert single.returncode == 0, single.stderr[-4000:]

    # the twin's pieces: both replicas served rollouts and took every sync by broadcast; the
    # reference's engine took the tensors in process
    twin_summary = json.loads((twin_dir / "summary.json").read_text())
    replicas = twin_summary["engine_replicas"]["replicas"]
    assert len(replicas) == 2 and all(r["sessions"] > 0 and r["down"] is None for r in replicas)
    assert twin_summary["weight_sync"] == ["collective", "collective"]
    assert json.loads((single_dir / "summary.json").read_text())["weight_sync"] == ["direct"]
    trainer = yaml.safe_load((twin_dir / "config.yaml").read_text())["trainer"]
    assert (trainer["fsdp_ranks"], trainer["context_parallel"], trainer["packing"]) == (2, 2, True)

    # the same rollouts (tokens, statuses, rewards), so both updates see the same batches
    twin_rollouts = rollouts(twin_dir)
    assert len(twin_rollouts) == ROLLOUTS
    assert twin_rollouts == rollouts(single_dir)
    assert all(r[3] != "infra_error" for r in twin_rollouts)

    # the same updates, every sample trained (fixed baseline: the random model earns 0)
    twin_steps, single_steps = (
        records(twin_dir / "metrics.jsonl"),
        records(single_dir / "metrics.jsonl"),
    )
    assert [m["step"] for m in twin_steps] == [1, 2]
    for got, want in zip(twin_steps, single_steps, strict=True):
        assert got["train/skipped_samples"] == 0 < got["samples"]
        assert got["train/loss"] == pytest.approx(want["train/loss"], abs=1e-6)
        # packed, chunked, split rows round apart from padded whole ones (measured: 4.5e-6 at
        # step 1, 2.3e-5 at step 2, after a step that moved the weights slightly differently)
        assert got["train/grad_norm"] == pytest.approx(want["train/grad_norm"], rel=1e-4)
        assert got["train/policy_version"] == want["train/policy_version"]
        # the fingerprint-checked sync ran, and step 2's rollouts, sampled from the replicas
        # after it, score the same logprobs in the trainer (the engines serve its weights)
        assert got["time/weight_sync_s"] > 0
        assert got["train/logprob_diff_max"] < 1e-4

    # AdamW's first steps move each weight by about lr whatever its gradient's size, so a weight
    # whose gradient is near 0 can move differently on the two layouts (measured: 12 of 6.6 M
    # weights by more than 1e-6, the worst by 1.9e-5 of a 2.0e-3 move); the update as a whole
    # must agree to 1e-4 of its size (measured 6.1e-6). A wrong layout (e.g. attention within
    # each rank's chunk only) flips the signs of many updates: both bounds would fail.
    final = load_file(twin_dir / "final_model/model.safetensors")
    reference = load_file(single_dir / "final_model/model.safetensors")
    base = load_file(resolve_model_path(TINY_QWEN3) / "model.safetensors")
    assert final.keys() == reference.keys()
    names = [k for k in reference if k in base]  # the tied head is saved under both names
    diff = torch.cat([(final[k] - reference[k]).flatten() for k in names])
    moved = torch.cat([(reference[k] - base[k]).flatten() for k in names])
    assert float(diff.norm() / moved.norm()) < UPDATE_TOLERANCE
    assert float(diff.abs().max()) < float(moved.abs().max()) / 20
