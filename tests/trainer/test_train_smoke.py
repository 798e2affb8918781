"""`conveyor train` end to end, one step of everything: the CI smoke version of the quickstart.

Real pieces throughout: the embedded model on in-process vLLM, oracle-trace warm start, one RL
step through the dispatcher with in-place weight sync, held-out evaluations, export, resume.

The smoke run is made once per file (`smoke_run`): the contract-file test reads and resumes it,
and the lr=0 arm reuses its warm start (it used to make a second, identical run for that).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SMALL = [
    "rl.steps=1",
    "rl.eval.tasks=2",
    "rl.warm_start.steps=1",
    "rl.warm_start.tasks=2",
    "rl.warm_start.batch_size=2",
    "tasks.num_tasks=4",
    "rl.tasks_per_step=2",
    "tasks.group_size=2",
    "rl.checkpoints.every=1",
]


def train(*extra: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "conveyor.cli", "train", "configs/filenav.yaml"]
    for item in [*SMALL, *extra]:
        args += ["--set", item]
    return subprocess.run(args, capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def smoke_run(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One finished smoke run (SMALL) and what its command printed."""
    del model_dir  # prepared first: the run starts from it
    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    return run_dir, train(f"run.dir={run_dir}")


def test_quickstart_smoke_writes_the_contract_files(
    smoke_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    run_dir, result = smoke_run
    assert result.returncode == 0, result.stderr[-4000:]
    assert Path(result.stdout.strip().splitlines()[-1]) == run_dir
    for name in ("eval_before.json", "eval_after_sft.json", "eval_after.json"):
        report = json.loads((run_dir / name).read_text())
        assert report["n"] == 2 and 0.0 <= report["pass_rate"] <= 1.0  # filenav only
        assert report["ci95"][0] <= report["pass_rate"] <= report["ci95"][1]
    (line,) = (run_dir / "metrics.jsonl").read_text().splitlines()
    metrics = json.loads(line)
    assert metrics["step"] == 1 and metrics["rollout/trajectories"] == 4
    # The probe: trainer and engine agree on the sampled tokens' logprobs right after a sync.
    assert metrics["train/logprob_diff_mean"] < 0.5
    assert (run_dir / "final_model" / "model.safetensors").is_file()
    assert (run_dir / "plots" / "reward.png").is_file()
    assert (run_dir / "checkpoints").is_dir()
    # Resuming a finished run repeats no step.
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor.cli",
            "train",
            "configs/filenav.yaml",
            *[arg for item in SMALL for arg in ("--set", item)],
            "--resume",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert again.returncode == 0, again.stderr[-4000:]
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]


def test_an_lr0_arm_reuses_the_warm_start_through_the_cli(
    tmp_path: Path, smoke_run: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    """`rl.warm_start.from_run`: the arm trains no warm start of its own, starts RL from the
    source's `sft_model/` (byte for byte) and pairs its RL share on the source's warm-start
    evaluation. The source is the finished smoke run; the copies are compared with it as the
    arm found it."""
    source, first = smoke_run
    assert first.returncode == 0, first.stderr[-4000:]
    arm = tmp_path / "lr0"
    result = train(f"run.dir={arm}", f"rl.warm_start.from_run={source}", "trainer.lr=0")
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"warm start: reused from {source}" in result.stdout
    assert "warm start step" not in result.stdout  # no training of its own
    same = ("sft_model/model.safetensors", "eval_after_sft.json", "eval_before.json")
    for name in same:
        assert (arm / name).read_bytes() == (source / name).read_bytes(), name
    summary = json.loads((arm / "summary.json").read_text())
    assert "sft_s" not in summary["timings"]
    assert summary["rl_share"]["n"] == 2
    # lr 0: RL moved no weight, so the final model is the warm start's.
    from safetensors.torch import load_file

    warm = load_file(str(source / "sft_model" / "model.safetensors"))
    final = load_file(str(arm / "final_model" / "model.safetensors"))
    assert warm.keys() == final.keys()
    assert all(bool((warm[k] == final[k]).all()) for k in warm)
    # An arm whose warm start would differ is refused before the engine starts.
    other = tmp_path / "other"
    refused = train(f"run.dir={other}", f"rl.warm_start.from_run={source}", "trainer.seed=3")
    assert refused.returncode != 0
    assert "trainer.seed: 0 there, 3 here" in refused.stderr + refused.stdout
    assert not other.exists()
