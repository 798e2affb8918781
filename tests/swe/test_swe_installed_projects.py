"""Issue 14, part (a): real projects whose tests need the project installed.

Markdown finds its built-in extensions through its own entry points, stevedore loads the test
plugins its `setup.cfg` declares, keyring reads its entry points and metadata. Graded with the
project only on `PYTHONPATH`, a correct fix failed on them; now the release's `.dist-info` sits
beside the workspace. For each: the tests that need the metadata pass in the sandbox, and on a
small factory-built set the oracle (gold patch through `str_replace_editor`) scores 1 and
finishing at once scores 0, through the `swe` family. Sets are cached under the SWE home.
"""

from __future__ import annotations

import asyncio

import pytest
from factory_sets import factory_rows

from conveyor.agent.tools import ToolContext
from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.runtime.workspace import make_workspace
from conveyor.tasks.swe.dataset import SweRow
from conveyor.tasks.swe.environment import swe_home
from conveyor.tasks.swe.family import SweFamily
from conveyor.tasks.swe.grading import run_tests
from conveyor.types import ToolCall

AVAILABLE, WHY = bubblewrap_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not AVAILABLE, reason=WHY)]

# (project, version, a test that needs the installed metadata or entry points)
PROJECTS = [
    ("markdown", "3.11.3", "tests/test_apis.py::TestMarkdownBasics::testEntryPointExtension"),
    ("stevedore", "5.10.0", "stevedore/tests/test_extension.py::TestCallback::test_detect_plugins"),
    ("keyring", "25.7.0", "tests/test_packaging.py::test_entry_point"),
]
SET_SIZE = 2


def _rows(name: str, version: str) -> list[SweRow]:
    return factory_rows(name, version, SET_SIZE)


async def _score(row: SweRow, oracle: bool) -> float:
    family = SweFamily()
    task = family.task(row)
    runtime = await family.make_runtime(task)
    try:
        ctx = ToolContext(task=task, runtime=runtime)
        calls = family.oracle_calls(task) if oracle else []
        calls = calls or [ToolCall(name="finish", arguments={"answer": "done"})]
        for call in calls:
            outcome = await family.tools().execute(call, ctx, timeout_s=120, max_output_chars=10**5)
            assert not outcome.is_error, outcome.output
        return await family.score(task, None, runtime)
    finally:
        await runtime.close()


def test_these_are_the_factory_projects_the_trust_test_leaves_to_this_file() -> None:
    """test_swe_trust.py grades the oracle and the empty patch on every other factory project:
    together the two files cover each project at its pinned release once."""
    from test_swe_trust import FACTORY_PROJECTS, NEEDS_METADATA

    here = {(name, version) for name, version, _ in PROJECTS}
    assert here == {p for p in FACTORY_PROJECTS if p[0] in NEEDS_METADATA}


@pytest.mark.parametrize(("name", "version", "needs_metadata"), PROJECTS)
def test_metadata_tests_pass_and_oracle_resolves(
    name: str, version: str, needs_metadata: str
) -> None:
    from conveyor.tasks.swe.factory import prepare_project
    from conveyor.tasks.swe.projects import spec_for

    ctx = prepare_project(spec_for(name), version)
    assert ctx.metadata is not None
    with make_workspace(ctx.root, swe_home() / "workspaces") as ws:
        args = dict(select=[needs_metadata], pythonpath=ctx.layout.pythonpath)
        with_metadata = asyncio.run(run_tests(ws.path, ctx.env, metadata=ctx.metadata, **args))
        without = asyncio.run(run_tests(ws.path, ctx.env, **args))  # type: ignore[arg-type]
    assert with_metadata.passed() == {needs_metadata}, with_metadata.log_tail
    assert without.passed() == set(), "the test really needs the installed project"
    rows = _rows(name, version)
    assert len(rows) == SET_SIZE
    assert [asyncio.run(_score(row, oracle=True)) for row in rows] == [1.0] * SET_SIZE
    assert [asyncio.run(_score(row, oracle=False)) for row in rows] == [0.0] * SET_SIZE
