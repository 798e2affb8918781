"""RL's own share and its controls: the paired test, the per-seed interval and `conveyor report
arms` over run folders shaped like `conveyor train`'s."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conveyor.app.reports import eval_report, mcnemar_p, mean_interval, paired_comparison
from conveyor.cli import app
from conveyor.types import Status, Task, Trajectory


def test_mcnemar_is_the_exact_two_sided_binomial_test_of_the_discordant_pairs() -> None:
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(5, 5) == 1.0
    assert mcnemar_p(10, 0) == pytest.approx(2 / 2**10)
    # 12 gained, 3 lost: P(X <= 3 | n=15, 1/2), doubled
    tail = sum(math.comb(15, i) for i in range(4)) / 2**15
    assert mcnemar_p(12, 3) == pytest.approx(2 * tail) == mcnemar_p(3, 12)
    assert mcnemar_p(12, 3) < 0.05 < mcnemar_p(9, 4)


def test_a_paired_comparison_uses_only_instances_both_scored() -> None:
    before = {"outcomes": {"a": 0, "b": 1, "c": 0, "d": 1, "e": 0}}
    after = {"outcomes": {"a": 1, "b": 1, "c": 1, "d": 0, "x": 1}}  # e not scored, x not before
    got = paired_comparison(before, after)
    assert (got["n"], got["gained"], got["lost"]) == (4, 2, 1)
    assert got["delta"] == pytest.approx(0.25) and got["before"] == 0.5 and got["after"] == 0.75
    low, high = got["ci95"]
    assert low < 0.25 < high
    with pytest.raises(ValueError, match="per-instance outcomes"):
        paired_comparison({"pass_rate": 0.5}, after)


def test_the_interval_over_seeds_is_students() -> None:
    mean, _, high = mean_interval([0.10, 0.14, 0.12])
    assert mean == pytest.approx(0.12)
    assert high - mean == pytest.approx(4.303 * 0.02 / math.sqrt(3))
    assert mean_interval([0.3]) == (0.3, 0.3, 0.3)


def test_evaluation_reports_carry_per_instance_outcomes_without_infra_errors() -> None:
    tasks = [Task(id=f"t{i}", family="f", prompt=[], data={}) for i in range(3)]
    trajectories = [
        Trajectory(task_id="t0", sample_index=0, reward=1.0, status=Status.OK),
        Trajectory(task_id="t1", sample_index=0, reward=0.0, status=Status.OK),
        Trajectory(task_id="t2", sample_index=0, status=Status.INFRA_ERROR),
    ]
    report = eval_report(trajectories, tasks)
    assert report["outcomes"] == {"t0": 1, "t1": 0}
    assert report["n"] == 2 and report["infra_errors"] == 1


def _run(folder: Path, sft: list[int], after: list[int]) -> Path:
    folder.mkdir(parents=True)
    for name, outcomes in (("eval_after_sft", sft), ("eval_after", after)):
        report = {
            "pass_rate": sum(outcomes) / len(outcomes),
            "n": len(outcomes),
            "outcomes": {f"filing-eval-{i:04d}": v for i, v in enumerate(outcomes)},
        }
        (folder / f"{name}.json").write_text(json.dumps(report))
    (folder / "summary.json").write_text(json.dumps({"timings": {"wall_s": 1500.0}}))
    return folder


def test_report_arms_puts_the_arms_side_by_side(tmp_path: Path) -> None:
    rng = random.Random(0)
    n = 200
    arms: dict[str, list[Path]] = {"rl": [], "lr0": []}
    for seed in range(3):
        sft = [int(rng.random() < 0.35) for _ in range(n)]
        # RL: +~15 points (flips failures to successes); lr=0: the same outcomes again
        learned = [1 if v or rng.random() < 0.25 else 0 for v in sft]
        arms["rl"].append(_run(tmp_path / f"rl-{seed}", sft, learned))
        arms["lr0"].append(_run(tmp_path / f"lr0-{seed}", sft, list(sft)))
    args = ["report", "arms", *(f"{k}={','.join(map(str, v))}" for k, v in arms.items())]
    done = CliRunner().invoke(app, [*args, "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    rl, lr0 = report["rl"], report["lr0"]
    assert rl["every_share_positive"] and rl["every_seed_significant"] and rl["pooled_significant"]
    assert 0.1 < rl["share_mean"] < 0.25 and rl["share_ci95"][0] > 0
    assert lr0["share_mean"] == 0 and not lr0["pooled_significant"]
    assert lr0["pooled"]["n"] == 3 * n  # pooled over seeds, instances kept apart per seed
    assert [s["wall_s"] for s in rl["seeds"]] == [1500.0] * 3
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0
    assert "| **rl** | mean of 3 |" in table.output and "| lr0 | lr0-2 |" in table.output


def test_report_arms_refuses_bad_arms_and_missing_evaluations(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["report", "arms", "rl"])
    assert done.exit_code == 2 and "NAME=DIR" in done.output
    (tmp_path / "run").mkdir()
    done = CliRunner().invoke(app, ["report", "arms", f"rl={tmp_path / 'run'}"])
    assert done.exit_code == 2 and "eval_after_sft.json is missing" in done.output


def test_eval_summaries_report_taus_pass_hat_k_beside_pass_at_k() -> None:
    from conveyor.app.reports import pass_hat_k, summarize

    tasks = [Task(id=f"tau2-eval-{i}", family="tau2", prompt=[]) for i in range(2)]
    rewards = {"tau2-eval-0": [1.0, 1.0, 0.0, 1.0], "tau2-eval-1": [1.0, 0.0, 0.0, 0.0]}
    rollouts = [
        Trajectory(task_id=task_id, sample_index=i, reward=r)
        for task_id, values in rewards.items()
        for i, r in enumerate(values)
    ]
    rollouts.append(Trajectory(task_id="tau2-eval-1", sample_index=4, status=Status.INFRA_ERROR))
    block = summarize(rollouts, tasks, k=4)["families"]["tau2"]
    # pass^k = C(c, k) / C(n, k): 3 of 4 and 1 of 4 solved; the infra error is not a try
    assert block["pass^1"] == (3 / 4 + 1 / 4) / 2 == block["pass@1"]
    assert block["pass^2"] == (3 / 6 + 0) / 2 and block["pass^4"] == 0.0
    assert block["pass@2"] > block["pass^2"]
    assert pass_hat_k(4, 4, 4) == 1.0 and pass_hat_k(2, 2, 3) == 0.0
