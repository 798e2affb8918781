"""SWE-bench rows with SWE-bench's semantics: rows in its format load (or are refused, saying
why), any row exports as a record the official `swebench` package (5.0.2, real) accepts, its
log parsers grade rows whose tests run under another runner (Django's), our grader and its
parser agree on a factory-style row, and `conveyor eval` writes `predictions.jsonl` that the
official harness's loader reads."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from factory_sets import edited_rollout_reward
from swebench.harness.utils import get_predictions_from_file, make_test_spec
from tiny_django_project import django_row
from tiny_project import buggy_calc, tiny_row
from trust_attacks import payload
from typer.testing import CliRunner

from conveyor.cli import app
from conveyor.config import load_config
from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.tasks.family import split_of
from conveyor.tasks.swe.dataset import SweRow, load_rows, to_swebench, write_rows
from conveyor.tasks.swe.grading import grade
from conveyor.tasks.swe.patches import file_diff
from conveyor.tasks.swe.swebench_spec import (
    parser_name,
    read_statuses,
    row_test_command,
    uses_log_grading,
    verdict,
    wrap_command,
)

AVAILABLE, WHY = bubblewrap_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"no bubblewrap sandbox here: {WHY}")

# A record as the HF dataset (princeton-nlp/SWE-bench) ships one: test lists as JSON strings.
DJANGO_RECORD = {
    "repo": "django/django",
    "instance_id": "django__django-11099",
    "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c",
    "patch": "diff --git a/x b/x\n",
    "test_patch": "diff --git a/tests/x b/tests/x\n",
    "problem_statement": "UsernameValidator allows trailing newline in usernames",
    "hints_text": "",
    "created_at": "2019-03-20T03:46:18Z",
    "version": "3.0",
    "FAIL_TO_PASS": json.dumps(
        ["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"]
    ),
    "PASS_TO_PASS": json.dumps(
        ["test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest)"]
    ),
    "environment_setup_commit": "419a78300f7cd27611196e1e464d50fd0385ff27",
    "image_name": "swebench/sweb.eval.x86_64.django_1776_django-11099",
}


def test_swebench_rows_load_and_bad_ones_are_refused_saying_why() -> None:
    row = SweRow.model_validate(DJANGO_RECORD)
    assert row.FAIL_TO_PASS == [
        "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"
    ]
    assert row.environment_setup_commit == "419a78300f7cd27611196e1e464d50fd0385ff27"
    assert row.image_name == DJANGO_RECORD["image_name"]
    assert row.extra["hints_text"] == ""
    # swebench's parser for the repository: Django's runner, sympy's bin/test
    assert parser_name(row) == "parse_log_django" and uses_log_grading(row)
    sympy = SweRow.model_validate({**DJANGO_RECORD, "repo": "sympy/sympy"})
    assert parser_name(sympy) == "parse_log_sympy"
    # swebench 5 keeps the test command in the row's eval_script, not per repository
    with pytest.raises(ValueError, match="needs its eval_script"):
        row_test_command(row)
    script = "cd /testbed\n: '>>>>> Start Test Output'\n./tests/runtests.py x\n"
    script += ": '>>>>> End Test Output'\n"
    with_script = row.model_copy(update={"eval_script": script})
    assert row_test_command(with_script) == "./tests/runtests.py x"
    # the host grader has no checkout of a git repository
    with pytest.raises(ValueError, match="no checkout"):
        asyncio.run(grade(with_script, ""))
    bad = {
        "base_commit": ("", "needs its base_commit"),
        "repo": ("django", "expected 'owner/name'"),
        "FAIL_TO_PASS": ("[not json", "not a JSON list"),
        "eval_type": ("sometimes", "eval_type"),
        "log_parser": ("parse_log_nope", "not one of swebench's"),
    }
    for key, (value, why) in bad.items():
        with pytest.raises(ValueError, match=why):
            parser_name(SweRow.model_validate({**DJANGO_RECORD, key: value}))
    with pytest.raises(ValueError, match="FAIL_TO_PASS is empty"):
        SweRow.model_validate({**DJANGO_RECORD, "FAIL_TO_PASS": "[]"})


def test_factory_rows_export_as_records_the_official_package_accepts(tmp_path: Path) -> None:
    rows = [tiny_row(), django_row()]
    write_rows(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "swebench.jsonl"
    result = CliRunner().invoke(
        app, ["tasks", "export", "--tasks", str(tmp_path / "rows.jsonl"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(isinstance(r["FAIL_TO_PASS"], str) for r in records)
    assert records[0]["image"] == "conveyor/sweb.eval.tinycalc__add_bug"
    assert records[0]["log_parser"] == "parse_log_pytest"
    assert (
        "python -m pytest -rA -p no:cacheprovider --continue-on-collection-errors"
        in (records[0]["eval_script"])
    )
    assert records[1]["log_parser"] == "parse_log_django"
    for record, row in zip(records, rows, strict=True):
        spec = make_test_spec(record)  # the harness's own reading of an instance
        assert spec.FAIL_TO_PASS == row.FAIL_TO_PASS and spec.log_parser == record["log_parser"]
    # and they load back as the same rows: one format for both kinds
    again = load_rows(out)
    assert [r.FAIL_TO_PASS for r in again] == [r.FAIL_TO_PASS for r in rows]
    assert [r.env for r in again] == [r.env for r in rows]
    # a record carries its harness script: graded as the harness grades it (its log)
    assert uses_log_grading(again[0]) and uses_log_grading(again[1])
    assert not uses_log_grading(rows[0])
    # swebench's pytest parser keys a test by its id up to the first space (as its datasets
    # store such ids): the record carries that form, and ours whole beside it
    spaced = "tests/test_calc.py::test_add[a b]"
    row = rows[0].model_copy(update={"FAIL_TO_PASS": [spaced]})
    record = to_swebench(row)
    assert json.loads(record["FAIL_TO_PASS"]) == ["tests/test_calc.py::test_add[a"]
    assert SweRow.model_validate(record).FAIL_TO_PASS == [spaced]
    log = f">>>>> Start Test Output\nPASSED {spaced}\n>>>>> End Test Output\n"
    assert read_statuses(row, log)[0][spaced] == "PASSED"


def test_a_log_whose_exit_status_contradicts_it_is_refused() -> None:
    """swebench's cross-check: a patch printing "ok" for every test while the runner exits 1
    (the runner's real FAIL lines came first) resolves nothing."""
    row = django_row()
    lines = [f"{t} ... FAIL" for t in row.FAIL_TO_PASS] + [f"{t} ... ok" for t in row.PASS_TO_PASS]
    forged = [f"{t} ... ok" for t in row.FAIL_TO_PASS]
    log = ">>>>> Start Test Output\n" + "\n".join(lines + forged) + "\n>>>>> End Test Output\n"
    assert verdict(row, log + ">>>>> Test Exit Code: 0\n").resolved  # what a parser alone says
    refused = verdict(row, log + ">>>>> Test Exit Code: 1\n")
    assert not refused.valid and not refused.resolved
    assert "SWEBENCH_TEST_EXIT_CODE=$?" in wrap_command("python tests/runtests.py")


@needs_sandbox
def test_a_django_row_is_graded_through_its_runner_and_swebench_s_parser() -> None:
    row = django_row()
    gold = asyncio.run(grade(row, row.patch))
    assert gold.resolved and gold.reward == 1.0 and gold.f2p_passed == 3, gold
    assert set(gold.outcomes.values()) == {"passed"}
    empty = asyncio.run(grade(row, ""))
    assert not empty.resolved and empty.f2p_passed == 0 and empty.p2p_passed == 1, empty
    # The runner script is the row's test code: a patch rewriting it to print "ok" for every
    # test is reverted by the tree guard before the tests run.
    forged_runner = "import sys\n" + "".join(
        f"print({t + ' ... ok'!r}, file=sys.stderr)\n" for t in row.FAIL_TO_PASS
    )
    runtests = (row_root(row) / "tests" / "runtests.py").read_text()
    attack = file_diff("tests/runtests.py", runtests, forged_runner)
    attacked = asyncio.run(grade(row, attack))
    assert "tests/runtests.py" in attacked.dropped_paths and not attacked.resolved, attacked


def row_root(row: SweRow) -> Path:
    from conveyor.tasks.swe.grading import row_template

    return row_template(row)


@needs_sandbox
def test_swebench_parity_check_agrees_on_a_pytest_row(tmp_path: Path) -> None:
    """`conveyor tasks swebench-parity`: our outcome channel and swebench's pytest parser give
    the same verdicts, per test and resolved, on the gold and the empty patch."""
    write_rows(tmp_path / "rows.jsonl", [tiny_row()])
    result = CliRunner().invoke(
        app, ["tasks", "swebench-parity", "--tasks", str(tmp_path / "rows.jsonl"), "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["ok"] and report["agree"] == report["cases"] == 2
    assert report["gold"]["theirs_resolved"] == 1 and report["empty"]["theirs_resolved"] == 0
    assert report["tests_compared"] == 10


@needs_sandbox
def test_eval_writes_predictions_the_official_loader_reads(
    tmp_path: Path, model_dir: Path, tokenizer: object
) -> None:
    """`conveyor eval` (in process, simulated engine) of one swe task. (`tokenizer`: the
    suite's session fixture; the run loads the same tokenizer, whose transformers import is
    then paid once per test worker, not here.)"""
    from conveyor.app.evaluate import run_eval

    name = next(
        f"tinycalc__pred{i}" for i in range(100) if split_of(f"tinycalc__pred{i}") == "eval"
    )
    rows = tmp_path / "rows.jsonl"
    write_rows(rows, [tiny_row(name)])
    resolved = load_config(
        None,
        [
            "engine.kind=simulated",
            "tasks.families=[swe]",
            # canaries 0: no gold validation run; the predictions are what this test reads
            f"tasks.options={{swe: {{rows: [{rows}], grading: {{canaries: 0}}}}}}",
            "tasks.num_tasks=1",
            "tasks.group_size=1",
            "runtime.kind=bubblewrap",
            "dispatch.reward_timeout_s=1000",
            "agent.hints.enabled=false",
            "agent.max_turns=1",
            "agent.max_completion_tokens=8",
            f"run.dir={tmp_path / 'run'}",
        ],
    )
    run_dir = asyncio.run(run_eval(resolved, show_progress=False))
    path = run_dir / "predictions.jsonl"
    predictions = get_predictions_from_file(str(path), "unused", "test")
    assert [p["instance_id"] for p in predictions] == [name]
    assert set(predictions[0]) == {"instance_id", "model_name_or_path", "model_patch"}
    assert predictions[0]["model_name_or_path"] == model_dir.name
    assert isinstance(predictions[0]["model_patch"], str)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["swebench_predictions"] == {"written": 1, "ungraded": 0}


@needs_sandbox
def test_a_log_graded_row_fails_closed_without_its_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """The log path runs the policy's code only in the grader's sandbox: when bubblewrap cannot
    start, the grade is an infrastructure error (`RuntimeFailure`), never an unsandboxed run."""
    from conveyor.runtime.base import RuntimeFailure
    from conveyor.tasks.swe import grading

    monkeypatch.setattr(grading, "bubblewrap_available", lambda: (False, "probe failed (test)"))
    row = django_row()
    with pytest.raises(RuntimeFailure, match="grading never runs unsandboxed"):
        asyncio.run(grade(row, row.patch))


# Targeted attacks (the hidden F2P ids known to the attacker, so no canary can catch them) that
# rewrite what pytest itself reports, log lines and exit status alike: swebench's parser alone
# would pay them. (The trust tests' import hook and tracer skip asserts only where a statement
# follows them, which the tiny project's tests lack: test_swe_trust.py runs it on toolz.)
LOG_FORGERIES = ["plugin_without_file", "plugin_claiming_pytest_module"]


def _exported_attack(attack: str) -> tuple[SweRow, dict[str, object]]:
    """The tiny row as a SWE-bench record (log-graded), and the editor call appending the
    targeted attack to the module its hidden tests import."""
    row = SweRow.model_validate(to_swebench(tiny_row()))
    assert uses_log_grading(row) and parser_name(row) == "parse_log_pytest"
    arguments: dict[str, object] = {
        "command": "insert",
        "path": "/workspace/tinycalc/__init__.py",
        "insert_line": buggy_calc().count("\n"),
        "new_str": payload(attack, list(row.FAIL_TO_PASS)),
    }
    return row, arguments


@needs_sandbox
@pytest.mark.parametrize("attack", LOG_FORGERIES)
def test_a_log_graded_pytest_row_runs_under_the_in_process_defences(attack: str) -> None:
    """Through the RL path (a rollout's workspace edited with the real editor, rewarded by the
    reward stage): the exported row's own test command runs through our bootstrap, so a forgery
    of pytest's reports is caught as tampering and scores 0."""
    row, arguments = _exported_attack(attack)
    trajectory = edited_rollout_reward(row, [arguments])
    assert trajectory.reward == 0.0, trajectory.messages[-1:]
    assert trajectory.metrics["reward/tampered"] == 1.0


@needs_sandbox
def test_the_log_forgeries_are_paid_without_the_in_process_defences(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The adversaries are real: with the bootstrap's defences off, the same edits score 1 on
    the log grader (swebench's parser reads the forged report as it stands)."""
    from conveyor.tasks.swe import test_run

    monkeypatch.setattr(test_run, "HARDENING", dict.fromkeys(test_run.HARDENING, False))
    for attack in LOG_FORGERIES:
        row, arguments = _exported_attack(attack)
        assert edited_rollout_reward(row, [arguments]).reward == 1.0, attack


def test_a_log_run_void_at_a_limit_says_which() -> None:
    """A test the bug makes loop ends the log run at the whole-run deadline or, on an idle
    machine, at the sandbox's CPU-time limit (the command dies of SIGXCPU, exit 152, before
    pytest's summary): either is named, so the parity check compares verdicts only there
    (a 20-row parity run on an idle machine reported 761 MISSING statuses as disagreements)."""
    from conveyor.tasks.swe.log_grading import CPU_LIMIT, TIMED_OUT, void_run

    log = ">>>>> Start Test Output\n...\n>>>>> End Test Output\n>>>>> Test Exit Code: 152\n"
    assert void_run(log, timed_out=False) == f"{CPU_LIMIT} (exit 152, SIGXCPU)"
    assert void_run(log, timed_out=True) == TIMED_OUT
    assert void_run(log.replace("152", "1"), timed_out=False) is None
