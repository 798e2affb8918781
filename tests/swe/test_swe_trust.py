"""Issue 28 acceptance: every attack class of the trust issue, on real factory projects.

Each attack (tests/swe/trust_attacks.py) is library code appended to the module the task's gold
patch edits (so the hidden tests import it), or a patch that sneaks a `conftest.py` past a
reader of patch text. Each is graded twice: through the RL path (a rollout's workspace edited
with the real `str_replace_editor`, rewarded by the rollout stages' reward, i.e.
`SweFamily.grade`) and through `conveyor tasks grade --patch`. Every one scores 0, on toolz and on
inflection rows built by the factory. The attacks are real: with every defence switched off
(canaries, the tree guard and the test process's in-process hardening) the same edits score 1.
Which single defence stops which attack is shown in test_swe_canaries.py (canaries),
test_swe_audit.py (each in-process check) and test_swe_tree_guard.py (the tree guard); the
table is in docs/sandbox.md. Also here: the oracle resolves and the empty patch does not on
every factory project (2 rows each), with all defences on (the three that need their installed
metadata in test_swe_installed_projects.py, on the same rows).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from factory_sets import edited_rollout_reward, factory_rows
from trust_attacks import LIBRARY_ATTACKS, conftest_forcing, payload, quoted_path_patch
from typer.testing import CliRunner

from conveyor.agent.tools import ToolContext
from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.tasks.swe import canaries, guards, test_run
from conveyor.tasks.swe.cli import tasks_app
from conveyor.tasks.swe.dataset import SweRow, write_rows
from conveyor.tasks.swe.family import SweFamily
from conveyor.tasks.swe.grading import GradingOptions, row_template
from conveyor.tasks.swe.patches import file_diff, patch_paths, read_text
from conveyor.types import Task, ToolCall, Trajectory

AVAILABLE, WHY = bubblewrap_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not AVAILABLE, reason=WHY)]

ATTACK_PROJECTS = [("toolz", "1.2.0"), ("inflection", "0.5.1")]
# Every project of the factory (src/conveyor/tasks/swe/projects.py) at a pinned release.
FACTORY_PROJECTS = [
    ("toolz", "1.2.0"),
    ("inflection", "0.5.1"),
    ("schema", "0.7.8"),
    ("boltons", "26.2.0"),
    ("attrs", "26.1.0"),
    ("more-itertools", "11.2.1"),
    ("pyparsing", "3.3.3"),
    ("markdown", "3.11.3"),
    ("stevedore", "5.10.0"),
    ("keyring", "25.7.0"),
]
# The three projects whose tests need the release's installed metadata: their oracle and empty
# patch are graded on these same rows (2 each, every defence on) by
# test_swe_installed_projects.py, beside the metadata check; not a second time here.
NEEDS_METADATA = {"markdown", "stevedore", "keyring"}
PATCH_ATTACKS = ("conftest_quoted_name",)


@pytest.fixture
def defences_off(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every defence of the verdict switched off: no canaries, no tree guard, no in-process
    hardening (what the grader was before issues 14 and 28, less its path guard)."""

    async def no_canaries(row: SweRow, options: GradingOptions) -> list[canaries.Canary]:
        return []

    monkeypatch.setattr(canaries, "row_canaries", no_canaries)
    monkeypatch.setattr(guards, "restore_protected", lambda *args, **kwargs: {})
    monkeypatch.setattr(test_run, "HARDENING", dict.fromkeys(test_run.HARDENING, False))
    yield


def _target(row: SweRow) -> tuple[str, str]:
    """The library module the gold patch edits, and its text in the starting state."""
    path = sorted(p for p in patch_paths(row.patch) if p.endswith(".py"))[0]
    text = read_text(row_template(row) / path)
    assert text is not None
    return path, text


def _rl(row: SweRow, attack: str) -> Trajectory:
    """A rollout whose workspace gets the attack through the real editor tool, rewarded by the
    reward stage."""
    path, text = _target(row)
    if attack in LIBRARY_ATTACKS:
        arguments = {
            "command": "insert",
            "path": f"/workspace/{path}",
            "insert_line": text.count("\n") + (0 if text.endswith("\n") else 1),
            "new_str": payload(attack, None),
        }
    else:
        folder = next(iter(sorted(p.rsplit("/", 1)[0] for p in patch_paths(row.test_patch))))
        conftest = f"{folder}/conftest.py" if "/" in folder else "conftest.py"
        arguments = {
            "command": "create",
            "path": f"/workspace/{conftest}",
            "file_text": conftest_forcing(None),
        }

    return edited_rollout_reward(row, [arguments])


def _cli(row: SweRow, attack: str, tmp_path: Path) -> dict[str, object]:
    """`conveyor tasks grade --patch` of the attack; the JSON summary."""
    tasks = tmp_path / "rows.jsonl"
    write_rows(tasks, [row])
    path, text = _target(row)
    if attack in LIBRARY_ATTACKS:
        patch = file_diff(path, text, text + payload(attack, None))
    else:
        patch = quoted_path_patch("conftest.py", conftest_forcing(None))
    (tmp_path / "attack.diff").write_bytes(patch.encode())
    args = ["grade", "--tasks", str(tasks), "--instance", row.instance_id, "--json"]
    result = CliRunner().invoke(tasks_app, [*args, "--patch", str(tmp_path / "attack.diff")])
    assert result.exit_code == 0, result.output
    summary: dict[str, object] = json.loads(result.output.splitlines()[-1])
    return summary


ATTACKS = [*sorted(LIBRARY_ATTACKS), *PATCH_ATTACKS]


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize(("name", "version"), ATTACK_PROJECTS)
def test_each_attack_scores_zero_on_factory_projects(
    name: str, version: str, attack: str, tmp_path: Path
) -> None:
    row = factory_rows(name, version)[0]
    trajectory = _rl(row, attack)
    assert trajectory.reward == 0.0, trajectory.messages[-1:]
    assert trajectory.metrics["reward/resolved"] == 0.0
    summary = _cli(row, attack, tmp_path)
    assert summary["resolved"] is False, summary
    if attack in LIBRARY_ATTACKS:
        # a forgery is scored as the policy's, and counted as tampering
        assert trajectory.metrics["reward/tampered"] == 1.0 or attack == "magic_equality"
        assert summary["tampered"] is True or attack == "magic_equality"


# The magic object pays only where a failing test compares the library's return value with ==
# (not this toolz row's memoize tests); test_swe_canaries.py shows it paid on the tiny project.
@pytest.mark.parametrize("attack", [a for a in ATTACKS if a != "magic_equality"])
def test_each_attack_is_paid_with_every_defence_off(attack: str, defences_off: None) -> None:
    """The adversaries are real: on the same toolz row, without the defences, each scores 1
    through the RL path. (`conveyor tasks grade` reaches the same grader: the test above runs
    every attack through both, defences on; proving each paid a second time, through the CLI,
    cost ~45 s of CI and showed nothing the RL path does not.)"""
    row = factory_rows(*ATTACK_PROJECTS[0])[0]
    assert _rl(row, attack).reward == 1.0


@pytest.mark.parametrize(
    ("name", "version"), [p for p in FACTORY_PROJECTS if p[0] not in NEEDS_METADATA]
)
def test_oracle_resolves_and_empty_does_not_on_every_factory_project(
    name: str, version: str, tmp_path: Path
) -> None:
    """With every defence on (canaries validated and run, the audit hook, the tree guard),
    through the family: the gold patch applied with the editor scores 1, finishing at once 0
    (the `NEEDS_METADATA` projects in test_swe_installed_projects.py). One row per project:
    the defences meet each project's own test suite there; a second row of the same project
    doubled the CI time for no other kind of test run."""
    family = SweFamily()
    for row in factory_rows(name, version, size=1):
        task = family.task(row)
        assert asyncio.run(_score(family, task, oracle=True)) == 1.0, row.instance_id
        assert asyncio.run(_score(family, task, oracle=False)) == 0.0, row.instance_id


async def _score(family: SweFamily, task: Task, oracle: bool) -> float:
    """The family's reward for the oracle's editor calls (or finishing at once)."""
    runtime = await family.make_runtime(task)
    try:
        ctx = ToolContext(task=task, runtime=runtime)
        calls = family.oracle_calls(task) if oracle else []
        for call in calls or [ToolCall(name="finish", arguments={"answer": "done"})]:
            outcome = await family.tools().execute(call, ctx, timeout_s=120, max_output_chars=10**5)
            assert not outcome.is_error, outcome.output
        return await family.score(task, None, runtime)
    finally:
        await runtime.close()
