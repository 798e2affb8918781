"""Our scorers against the upstream ones on a small sample (the full sweeps are
`conveyor tasks parity --scorer humaneval|rg`, numbers in docs/domains.md)."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.config import RuntimeConfig
from conveyor.tasks import parity
from conveyor.tasks.code import judge_answer
from conveyor.tasks.executor import executor_available

AVAILABLE, WHY = executor_available()


@pytest.mark.skipif(not AVAILABLE, reason=f"no bubblewrap sandbox here: {WHY}")
def test_humaneval_judge_agrees_with_check_correctness_on_gold_and_perturbed_answers() -> None:
    report = asyncio.run(parity.humaneval_parity(1, say=lambda _: None))
    assert report["gold"] == 1 and report["perturbed"] >= 5
    assert report["disagreements"] == [] and report["ok"]
    # a returned iterator: upstream's check consumes it in the candidate's process, so a test
    # that does list() passes and one comparing with a list fails; ours the same
    problem = {
        "task_id": "iterator/0",
        "prompt": "def evens(n):\n    '''The even numbers below n.'''\n",
        "entry_point": "evens",
        "canonical_solution": "    return (i for i in range(0, n, 2))\n",
        "test": "def check(candidate):\n    assert sorted(candidate(5)) == [0, 2, 4]\n",
    }
    strict = {**problem, "test": "def check(candidate):\n    assert candidate(5) == [0, 2, 4]\n"}
    for case, want in ((problem, True), (strict, False)):
        answer = case["canonical_solution"]
        ours = asyncio.run(judge_answer(case, answer, RuntimeConfig(), 3.0))
        assert ours.passed is want is parity._upstream_humaneval(case, answer), ours.detail


def test_rg_scores_equal_score_answer_on_gold_and_perturbed_answers() -> None:
    names = ["chain_sum", "countdown", "fraction_simplification", "gcd"]
    report = parity.rg_parity(names, say=lambda _: None)
    assert report["gold"] == 4 and report["perturbed"] >= 40
    assert report["disagree_unexplained"] == 0, report["disagreements"]
    # no stripping: the padded answer gets upstream's (lower) score, and None its own value
    assert report["upstream_mean_by_kind"]["padded"] < 1.0
    assert report["upstream_mean_by_kind"]["none"] > 0.0  # countdown gives 0.01 to None
    guarded = [d for d in report["disagreements"] if d["guard"]]
    assert {d["task_id"].split("/")[0] for d in guarded} <= {"countdown"}


def test_the_parity_command_reports_and_refuses_an_unknown_scorer() -> None:
    runner = CliRunner()
    args = ["tasks", "parity", "--scorer", "rg", "--datasets", "gcd", "--kinds", "gold,padded"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "rg: gold 1/1 agree, perturbed 1/1 agree" in result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["by_kind"] == {"gold": 1, "padded": 1} and report["ok"]
    bad = runner.invoke(app, ["tasks", "parity", "--scorer", "mbpp"])
    assert bad.exit_code != 0 and "no parity check for 'mbpp'" in bad.output
    assert "humaneval, rg, bfcl, tau2" in bad.output
