"""`tasks.options.swe`: rows and grading settings from the config, checked when it loads and
recorded in `config.yaml`; test commands with pytest flags; `conveyor tasks grade --set`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from tiny_project import CALC, buggy_calc, tiny_row
from typer.testing import CliRunner

from conveyor.config import ConfigError, config_to_yaml, load_config
from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.runtime.workspace import make_workspace
from conveyor.tasks.family import get_family
from conveyor.tasks.swe.cli import tasks_app
from conveyor.tasks.swe.dataset import RowEnvironment, SweRow, write_rows
from conveyor.tasks.swe.environment import swe_home
from conveyor.tasks.swe.family import SweFamily
from conveyor.tasks.swe.grading import grade, row_environment, row_template, run_tests
from conveyor.tasks.swe.options import file_sha256, task_set_path
from conveyor.tasks.swe.patches import apply_patch, file_diff
from conveyor.tasks.swe.test_command import parse_test_command, pytest_invocation
from conveyor.types import FamilyServices

AVAILABLE, WHY = bubblewrap_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=WHY)
FIX = file_diff("tinycalc/__init__.py", buggy_calc(), CALC)
# Above the default grading budget (900 s run + 60 s set-up), as every swe config needs.
ROOMY = "dispatch.reward_timeout_s=1000"


def _load(*overrides: str) -> dict:
    config = load_config(None, ["tasks.families=[swe]", ROOMY, *overrides]).config
    return config.tasks.options["swe"]


def _rows(path: Path, *ids: str) -> Path:
    write_rows(path, [tiny_row(i) for i in ids])
    return path


def test_bad_swe_options_are_refused_when_the_config_loads(tmp_path: Path) -> None:
    cases = {
        "tasks.options={swe: {rowz: [a]}}": r"tasks\.options\.swe: rowz: extra inputs",
        f"tasks.options={{swe: {{rows: [{tmp_path / 'nope.jsonl'}]}}}}": (
            r"tasks\.options\.swe: rows\.0: value error, rows file '.*nope\.jsonl' does not exist"
        ),
        "tasks.options={swe: {rows: [no-such-set]}}": (
            r"rows\.0: value error, no task set 'no-such-set': .*tasks/no-such-set\.jsonl does "
            "not exist"
        ),
        "tasks.options={swe: {grading: {semantics: loose}}}": r"grading\.semantics: input",
        "tasks.options={swe: {grading: {timeout: 3}}}": r"grading\.timeout: extra inputs",
        "tasks.options={swe: {grading: {runtime: local}}}": (
            r"runtime 'local' grades without a sandbox.*"
            r"unsandboxed_grading_i_trust_the_policy: true to allow it"
        ),
        "tasks.options={swe: {grading: {runtime: docker}}}": r"grading\.runtime: input should be",
    }
    for override, expected in cases.items():
        with pytest.raises(ConfigError, match=f"(?i){expected}"):
            _load(override)
    with pytest.raises(ValueError, match=r"tasks\.options\.swe: rows\.0: .*does not exist"):
        get_family("swe", services=FamilyServices(options={"rows": [str(tmp_path / "x")]}))


def test_rows_from_the_config_win_over_the_environment_and_are_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = _rows(tmp_path / "mine.jsonl", *(f"mine-{i:03d}" for i in range(40)))
    other = _rows(tmp_path / "other.jsonl", *(f"other-{i:03d}" for i in range(40)))
    monkeypatch.setenv("CONVEYOR_SWE_TASKS", str(other))
    monkeypatch.chdir(tmp_path)
    config = load_config(
        None, ["tasks.families=[swe]", ROOMY, "tasks.options={swe: {rows: mine.jsonl}}"]
    ).config
    recorded = yaml.safe_load(config_to_yaml(config))["tasks"]["options"]["swe"]
    assert recorded["rows"] == [{"path": str(mine), "sha256": file_sha256(mine)}]
    assert recorded["grading"]["run_timeout_s"] == 900.0  # every grading key is recorded
    family = get_family("swe", services=FamilyServices(options=config.tasks.options["swe"]))
    tasks = family.make_tasks(3, seed=0, split="train")
    assert all(t.data["row"]["instance_id"].startswith("mine-") for t in tasks)
    # config.yaml reads back into the same config ...
    again = tmp_path / "config.yaml"
    again.write_text(config_to_yaml(config))
    assert load_config(again).config == config
    # ... until the rows file changes: then the recorded hash refuses it, naming the key
    _rows(mine, "mine-000")
    with pytest.raises(ConfigError, match=r"tasks\.options\.swe: rows\.0: .*changed since"):
        load_config(again)
    with pytest.raises(ValueError, match=r"changed after the config was loaded"):
        family.make_tasks(1, seed=0, split="train")


def test_without_rows_the_environment_decides_and_the_config_says_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = _rows(tmp_path / "other.jsonl", "other-000")
    monkeypatch.setenv("CONVEYOR_SWE_TASKS", str(other))
    assert _load()["rows"] == [{"path": str(other), "sha256": file_sha256(other)}]
    monkeypatch.setenv("CONVEYOR_SWE_TASKS", str(tmp_path / "gone.jsonl"))
    with pytest.raises(ConfigError, match=r"rows \(from \$CONVEYOR_SWE_TASKS\): rows file"):
        _load()
    # a built family with no options at all reads the variable as before
    monkeypatch.setenv("CONVEYOR_SWE_TASKS", str(other))
    assert [r.instance_id for r in SweFamily().rows()] == ["other-000"]


def test_a_task_set_name_means_the_cache_s_tasks_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_SWE_HOME", str(tmp_path / "home"))  # a cache of its own
    monkeypatch.delenv("CONVEYOR_SWE_TASKS", raising=False)
    path = task_set_path("toolz")
    assert path == tmp_path / "home" / "tasks" / "toolz.jsonl"
    path.parent.mkdir(parents=True)
    _rows(path, "set-000")
    rows = _load("tasks.options={swe: {rows: [toolz]}}")["rows"]
    assert rows == [{"path": str(path), "sha256": file_sha256(path)}]
    assert _load()["rows"] == rows  # no rows, no variable: every task set of the cache


def test_the_reward_budget_follows_the_configured_run_timeout() -> None:
    options = {"grading": {"run_timeout_s": 2000, "per_test_timeout_s": 5}}
    family = get_family("swe", services=FamilyServices(options=options))
    assert isinstance(family, SweFamily)
    assert family.reward_budget_s == 2060 and family.grading.per_test_timeout_s == 5
    with pytest.raises(ConfigError, match=r"below the 'swe' family's grading budget \(2060 s\)"):
        _load("tasks.options={swe: {grading: {run_timeout_s: 2000}}}")
    assert _load(
        "tasks.options={swe: {grading: {run_timeout_s: 100}}}", "dispatch.reward_timeout_s=160"
    )


def test_test_commands_take_report_flags_and_refuse_the_rest() -> None:
    parsed = parse_test_command("python -m pytest -rA -p no:xdist")
    assert parsed.wrapper == () and parsed.pytest_flags == ("-rA", "-p", "no:xdist")
    assert parse_test_command("pytest --no-header -rA --tb=no -p no:cacheprovider").pytest_flags
    wrapped = parse_test_command("python -m coverage run --rcfile=x -m pytest -q")
    assert wrapped.wrapper == ("-m", "coverage", "run", "--rcfile=x")
    refused = {
        "python -m pytest -p tinycalc.hack": "loads a plugin",
        "python -m pytest -ptinycalc.hack": "loads a plugin",
        "python -m pytest -p no:conveyor_outcomes": "the grader's own plugin",
        "python -m pytest --rootdir=/tmp": "root directory",
        "python -m pytest -c setup.cfg": "configuration file",
        "python -m pytest --confcutdir=.": "conftest.py",
        "python -m pytest -o addopts=-x": "overrides",
        "python -m pytest --override-ini=addopts=-x": "overrides",
        "python -m pytest --pyargs": "as packages",
        "python -m pytest -k add": "selects tests",
        "python -m pytest -x": "stops the run early",
        "python -m pytest -n 4": "other processes",
        "python -m pytest tests/": "test path",
        "python -m pytest --frobnicate": "not a flag the grader accepts",
        "python -m notpytest": "expected 'python",
    }
    for command, why in refused.items():
        with pytest.raises(ValueError, match=why):
            parse_test_command(command)
    with pytest.raises(ValueError, match=r"(?s)test_cmd.*loads a plugin"):
        RowEnvironment(test_cmd="python -m pytest -p tinycalc.hack")


def test_a_log_graded_rows_plain_pytest_command_is_read_for_the_bootstrap() -> None:
    """`pytest_invocation`: a row's own one-line pytest run (the log grader starts it through
    our bootstrap, test paths and all) splits into its wrapper and its arguments; a shell line,
    another runner or a flag the grader refuses runs as written (None)."""
    assert pytest_invocation("pytest -rA tests/test_a.py") == ((), ("-rA", "tests/test_a.py"))
    assert pytest_invocation("python -m pytest --tb=no -p no:cacheprovider t.py") == (
        (),
        ("--tb=no", "-p", "no:cacheprovider", "t.py"),
    )
    wrapped = "python3 -m coverage run -m pytest -rA tests"
    assert pytest_invocation(wrapped) == (("-m", "coverage", "run"), ("-rA", "tests"))
    for command in [
        "cd /testbed && python -m pytest -rA tests",
        "python -m pytest -rA tests; echo done",
        "python -m pytest -rA $TESTS",
        "python -m pytest -rA tests\npython -m pytest other",
        "tox --current-env -epy39 -v -- tests/test_a.py",
        "python tests/runtests.py --verbosity 2",
        "python -m pytest -n 4 tests",
        "python -m pytest -p tinycalc.hack tests",
        "python -m pytest 'unclosed",
    ]:
        assert pytest_invocation(command) is None, command


def _flagged_row() -> SweRow:
    row = tiny_row("tinycalc__flagged")
    env = row.env.model_copy(update={"test_cmd": "python -m pytest -rA -p no:xdist"})
    return row.model_copy(update={"environment": env})


@needs_sandbox
def test_a_row_with_pytest_flags_grades_gold_1_and_empty_0() -> None:
    row = _flagged_row()
    gold = asyncio.run(grade(row, FIX))
    assert gold.resolved and gold.reward == 1.0 and not gold.violations
    empty = asyncio.run(grade(row, ""))
    assert not empty.resolved and empty.reward == 0.0
    # the row's flags reach pytest: -rA prints a line per passed test in the summary
    with make_workspace(row_template(row), swe_home() / "workspaces") as ws:
        apply_patch(ws.path, FIX)
        env = row_environment(row)
        select = ["tests/test_calc.py::test_add"]
        flagged = asyncio.run(run_tests(ws.path, env, select=select, test_cmd=row.env.test_cmd))
        plain = asyncio.run(run_tests(ws.path, env, select=select))
    assert "PASSED tests/test_calc.py::test_add" in flagged.log_tail
    assert "PASSED" not in plain.log_tail
    assert flagged.passed() == plain.passed() == set(select)


XFAIL = file_diff(
    "tinycalc/__init__.py",
    buggy_calc(),
    buggy_calc().replace("    return a - b", "    import pytest\n\n    pytest.xfail('known')"),
)


@needs_sandbox
def test_the_grade_cli_takes_the_run_s_grading_settings(tmp_path: Path) -> None:
    row = tiny_row("tinycalc__cli_settings")
    tasks = _rows(tmp_path / "rows.jsonl", row.instance_id)
    (tmp_path / "xfail.diff").write_text(XFAIL)
    args = ["grade", "--tasks", str(tasks), "--instance", row.instance_id, "--json"]
    args += ["--patch", str(tmp_path / "xfail.diff")]

    def resolved(*more: str) -> bool:
        result = CliRunner().invoke(tasks_app, [*args, *more])
        assert result.exit_code == 0, result.output
        return bool(json.loads(result.output.strip().splitlines()[-1])["resolved"])

    assert not resolved()
    assert resolved("--set", "semantics=swebench")
    assert resolved("--set", "tasks.options.swe.grading.semantics=swebench")
    config = tmp_path / "run.yaml"
    config.write_text(
        "tasks:\n  families: [swe]\n  options:\n    swe:\n"
        f"      rows: [{tasks}]\n      grading: {{semantics: swebench, run_timeout_s: 300}}\n"
    )
    assert resolved("--config", str(config))
    assert not resolved("--config", str(config), "--semantics", "strict")  # flags come last
    for setting, message in {
        "runtime=local": "unsandboxed_grading_i_trust_the_policy: true to allow it",
        "colour=red": "tasks.options.swe.grading: colour: Extra inputs",
        "run_timeout_s": "expected KEY=VALUE",
    }.items():
        bad = CliRunner().invoke(tasks_app, [*args, "--set", setting])
        assert bad.exit_code == 2 and message in bad.output, bad.output


def test_processes_without_a_composition_build_the_swe_family_with_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verl bridge's dataset export builds families from the config alone: its swe rows are
    the config's, not those of the environment variable."""
    from conveyor.bridges.verl.dataset import rows as verl_rows

    mine = _rows(tmp_path / "mine.jsonl", *(f"mine-{i:03d}" for i in range(40)))
    other = _rows(tmp_path / "other.jsonl", *(f"other-{i:03d}" for i in range(40)))
    monkeypatch.setenv("CONVEYOR_SWE_TASKS", str(other))
    config = load_config(
        None, ["tasks.families=[swe]", ROOMY, f"tasks.options={{swe: {{rows: [{mine}]}}}}"]
    ).config
    exported = verl_rows(config, split="train", n=2)
    ids = [json.loads(r["extra_info"]["task"])["data"]["row"]["instance_id"] for r in exported]
    assert len(ids) == 2 and all(i.startswith("mine-") for i in ids)
