"""Issue 28's honest cases: real fixes the grader must keep scoring 1.

Each case runs through the RL path (a rollout workspace of the `swe` family edited with the real
`str_replace_editor` and `bash` tools, graded with `SweFamily.score`/`grade_runtime`) and
through `grade(row, patch)`: the gold fix plus unrelated new files, an edit to a CRLF file, an
edit next to a form feed and U+2028, an edit to a library module named `test_*.py`, a harmless
`conftest.py` added (reverted and reported, never fatal) and a binary file added (refused by
name, reported). The text cases use the tiny text project (tests/swe/tiny_text_project.py);
the `test_*.py` module also on markdown 3.11.3's real `markdown/test_tools.py` (slow).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from tiny_project import CALC, buggy_calc, tiny_row
from tiny_text_project import BUGS, text_fix, text_row
from typer.testing import CliRunner

from conveyor.agent.tools import ToolContext
from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.tasks.swe.cli import tasks_app
from conveyor.tasks.swe.dataset import RowEnvironment, SweRow
from conveyor.tasks.swe.environment import project_source
from conveyor.tasks.swe.family import SweFamily, SweRuntime
from conveyor.tasks.swe.grading import GradeReport, grade, grade_runtime, workspace_patch
from conveyor.tasks.swe.patches import file_diff, split_lines
from conveyor.types import ToolCall

AVAILABLE, WHY = bubblewrap_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)
FIX = file_diff("tinycalc/__init__.py", buggy_calc(), CALC)

# An edit: ("edit", path, old text or "" to create, new text) or ("bash", command, "", "").
Step = tuple[str, str, str, str]


def _edit(path: str, old: str, new: str) -> Step:
    return ("edit", path, old, new)


def _bash(command: str) -> Step:
    return ("bash", command, "", "")


FIX_EDIT = _edit("tinycalc/__init__.py", "return a - b", "return a + b")


def _rollout(steps: Sequence[Step], row: SweRow) -> tuple[GradeReport, str]:
    """Carry out `steps` with the family's tools in a real rollout workspace; the grade of
    what it left (`grade_runtime`, whose reward is `SweFamily.score`) and its patch."""
    family = SweFamily()
    task = family.task(row)

    async def main() -> tuple[GradeReport, str]:
        runtime = await family.make_runtime(task)
        try:
            ctx = ToolContext(task=task, runtime=runtime)
            for kind, target, old, new in steps:
                if kind == "bash":
                    call = ToolCall(name="bash", arguments={"command": target})
                elif old:
                    arguments = {"command": "str_replace", "old_str": old, "new_str": new}
                    call = ToolCall(
                        name="str_replace_editor",
                        arguments={"path": f"/workspace/{target}", **arguments},
                    )
                else:
                    arguments = {"command": "create", "file_text": new}
                    call = ToolCall(
                        name="str_replace_editor",
                        arguments={"path": f"/workspace/{target}", **arguments},
                    )
                outcome = await family.tools().execute(
                    call, ctx, timeout_s=60, max_output_chars=10_000
                )
                assert not outcome.is_error, outcome.output
            graded_row = SweRow.model_validate(task.data["row"])
            report = await grade_runtime(graded_row, runtime)
            assert report.reward == await family.score(task, None, runtime)
            assert isinstance(runtime, SweRuntime)
            return report, workspace_patch(graded_row, runtime.workspace)
        finally:
            await runtime.close()

    return asyncio.run(main())


def _grade(row: SweRow, patch: str) -> GradeReport:
    return asyncio.run(grade(row, patch))


def _changed_lines(patch: str) -> list[str]:
    return [
        line
        for line in split_lines(patch)
        if line[:1] in "+-" and not line.startswith(("+++ ", "--- "))
    ]


UNRELATED = {
    "NOTES.md": "# what I tried\r\n",
    "scripts/check.sh": "#!/bin/sh\npython -m pytest -q\n",
    "tinycalc/extra.py": "def double(x):\n    return 2 * x\n",
}


def test_gold_plus_unrelated_new_files_scores_one() -> None:
    steps = [FIX_EDIT, *(_edit(path, "", text) for path, text in UNRELATED.items())]
    report, _ = _rollout(steps, tiny_row())
    assert report.reward == 1.0 and report.dropped_paths == {}
    patch = FIX + "".join(file_diff(path, None, text) for path, text in UNRELATED.items())
    direct = _grade(tiny_row(), patch)
    assert direct.resolved and direct.dropped_paths == {}


def test_an_edit_to_a_crlf_file_scores_one_and_is_a_one_line_diff() -> None:
    row = text_row("crlf")
    # The agent writes "\n" (its view of the file); the file keeps its CRLF line ends.
    report, patch = _rollout(
        [
            _edit(
                "tinytext/crlf.py",
                'mark."""\n    return text.lower()',
                'mark."""\n    return text.upper()',
            )
        ],
        row,
    )
    assert report.reward == 1.0 and report.dropped_paths == {}, report
    assert _changed_lines(patch) == [
        '-    return text.lower() + "!"\r\n',
        '+    return text.upper() + "!"\r\n',
    ]
    assert _grade(row, text_fix("crlf")).resolved


def test_an_edit_next_to_a_form_feed_and_u2028_scores_one() -> None:
    row = text_row("pages")
    report, patch = _rollout(
        [_edit("tinytext/pages.py", "in SEPARATORS[1:])", "in SEPARATORS)")], row
    )
    assert report.reward == 1.0 and report.dropped_paths == {}, report
    assert "\f\n" in patch and "\u2028" in patch, "the hunk's context holds them"
    assert _grade(row, text_fix("pages")).resolved


def test_an_edit_to_a_library_module_named_test_star_scores_one() -> None:
    row = text_row("test_tools")
    path = BUGS["test_tools"][0]
    report, _ = _rollout([_edit(path, 'endswith("?")', 'endswith("!")')], row)
    assert report.reward == 1.0 and report.dropped_paths == {}, report
    direct = _grade(row, text_fix("test_tools"))
    assert direct.resolved and direct.dropped_paths == {}


def test_a_harmless_conftest_is_dropped_and_reported_never_fatal() -> None:
    conftest = "import os\n\nSEEN = os.getcwd()\n"
    report, _ = _rollout([FIX_EDIT, _edit("conftest.py", "", conftest)], tiny_row())
    assert report.reward == 1.0
    assert report.dropped_paths == {"conftest.py": "test configuration"}
    direct = _grade(tiny_row(), FIX + file_diff("conftest.py", None, conftest))
    assert direct.resolved and direct.dropped_paths == {"conftest.py": "test configuration"}


def _git_binary_patch(tmp_path: Path, name: str, data: bytes) -> str:
    """A `GIT binary patch` creating `name`, as `git diff --binary` writes one."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / name).write_bytes(data)
    done = subprocess.run(
        ["git", "diff", "--no-index", "--binary", "a", "b"],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    return (
        done.stdout.decode().replace(f"a/b/{name}", f"a/{name}").replace(f"b/b/{name}", f"b/{name}")
    )


def test_a_binary_file_added_is_refused_by_name_and_the_fix_still_scores(tmp_path: Path) -> None:
    report, patch = _rollout(
        [FIX_EDIT, _bash("printf '\\377\\376\\000binary' > blob.dat")], tiny_row()
    )
    assert report.reward == 1.0 and report.dropped_paths == {"blob.dat": "binary file"}
    assert "blob.dat" not in patch
    binary = _git_binary_patch(tmp_path, "blob.dat", b"\xff\xfe\x00binary")
    assert "GIT binary patch" in binary
    direct = _grade(tiny_row(), FIX + binary)
    assert direct.resolved and direct.dropped_paths == {"blob.dat": "binary file"}


def test_the_cli_grades_a_crlf_fix_byte_exact(tmp_path: Path) -> None:
    row = text_row("crlf")
    tasks = tmp_path / "rows.jsonl"
    tasks.write_text(row.to_json() + "\n")
    patch = tmp_path / "fix.diff"
    patch.write_bytes(text_fix("crlf").encode())
    args = ["grade", "--tasks", str(tasks), "--instance", row.instance_id, "--json"]
    result = CliRunner().invoke(tasks_app, [*args, "--patch", str(patch)])
    assert json.loads(result.output.strip().splitlines()[-1])["resolved"] is True, result.output


MARKDOWN = ("markdown", "3.11.3")
DEDENT = "return textwrap.dedent(text).strip()"
HIDDEN_DEDENT = (
    "from markdown.test_tools import TestCase\n\n\n"
    "def test_dedent_strips():\n"
    '    assert TestCase().dedent("\\n    x\\n") == "x"\n'
)
HR = "tests/test_syntax/blocks/test_hr.py::TestHorizontalRules::"


def markdown_test_tools_row() -> SweRow:
    """A hand-made row on markdown's real `markdown/test_tools.py`, a library module named
    like a test: `TestCase.dedent` loses its `.strip()`; the syntax tests using it fail."""
    root, _ = project_source(*MARKDOWN)
    text = (root / "markdown/test_tools.py").read_bytes().decode()
    buggy = text.replace(DEDENT, "return textwrap.dedent(text)")
    assert buggy != text
    return SweRow(
        instance_id="markdown-3.11.3__test_tools_dedent",
        repo="pypi:markdown",
        version=MARKDOWN[1],
        problem_statement="TestCase.dedent no longer strips the text.",
        patch=file_diff("markdown/test_tools.py", buggy, text),
        test_patch=file_diff("tests/test_hidden_tools.py", None, HIDDEN_DEDENT),
        FAIL_TO_PASS=[
            f"{HR}test_2_consecutive_hr",
            f"{HR}test_hr_after_paragraph",
            "tests/test_hidden_tools.py::test_dedent_strips",
        ],
        PASS_TO_PASS=[f"{HR}test_hr_asterisks", f"{HR}test_hr_asterisks_long"],
        environment=RowEnvironment(
            setup_patch=file_diff("markdown/test_tools.py", text, buggy),
            extra_test_deps=["pyyaml"],
        ),
    )


@pytest.mark.slow
def test_markdowns_test_tools_module_is_the_agents_to_edit() -> None:
    """Before, `markdown/test_tools.py` was dropped as a test file by its name: the real fix
    scored 0. Now only what the task declares is a test."""
    row = markdown_test_tools_row()
    direct = _grade(row, row.patch)
    assert direct.resolved and direct.dropped_paths == {}, direct
    assert not _grade(row, "").resolved
    report, _ = _rollout(
        [_edit("markdown/test_tools.py", "return textwrap.dedent(text)\n", DEDENT + "\n")], row
    )
    assert report.reward == 1.0 and report.dropped_paths == {}, report
