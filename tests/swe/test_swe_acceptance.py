"""Issue 5 acceptance on real factory tasks from toolz, through the `swe` family.

An oracle applying the gold patch with `str_replace_editor` resolves all of 20 tasks; finishing
at once resolves none; agents that edit a failing test, add a `conftest.py` forcing passes, or
edit the pytest configuration get reward 0. The task set is built once by the factory (cached
under the SWE home; minutes the first time), or taken from a toolz build already there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from conveyor.agent.tools import ToolContext
from conveyor.runtime.base import Runtime
from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.tasks.swe.dataset import SweRow, load_rows, write_rows
from conveyor.tasks.swe.environment import swe_home
from conveyor.tasks.swe.family import SweFamily
from conveyor.types import Task, ToolCall

AVAILABLE, WHY = bubblewrap_available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not AVAILABLE, reason=WHY)]
SET_SIZE = 20
FORCE_PASS = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)


@pytest.fixture(scope="session")
def toolz_rows() -> list[SweRow]:
    """20 verified toolz mutation tasks (an existing build's, else built and cached)."""
    for path in [swe_home() / "tasks" / "toolz.jsonl", swe_home() / "test-sets" / "toolz.jsonl"]:
        if path.exists() and len(rows := load_rows(path)) >= SET_SIZE:
            return rows[:SET_SIZE]
    from conveyor.tasks.swe.factory import build_mutation_tasks, prepare_project
    from conveyor.tasks.swe.projects import spec_for

    ctx = prepare_project(spec_for("toolz"), "1.2.0")
    rows = asyncio.run(build_mutation_tasks(ctx, SET_SIZE))
    write_rows(swe_home() / "test-sets" / "toolz.jsonl", rows)
    return rows


Agent = Callable[[SweFamily, Task, ToolContext], Awaitable[None]]


async def _rollouts(rows: list[SweRow], agent: Agent) -> list[float]:
    family = SweFamily()
    slots = asyncio.Semaphore(2)

    async def one(row: SweRow) -> float:
        async with slots:
            task = family.task(row)
            runtime: Runtime = await family.make_runtime(task)
            try:
                ctx = ToolContext(task=task, runtime=runtime)
                await agent(family, task, ctx)
                return await family.score(task, ctx.state.get("answer"), runtime)
            finally:
                await runtime.close()

    return list(await asyncio.gather(*(one(row) for row in rows)))


async def _call(family: SweFamily, ctx: ToolContext, name: str, **arguments: object) -> str:
    outcome = await family.tools().execute(
        ToolCall(name=name, arguments=arguments), ctx, timeout_s=120, max_output_chars=100_000
    )
    assert not outcome.is_error, outcome.output
    return outcome.output


def test_oracle_resolves_every_task(toolz_rows: list[SweRow]) -> None:
    async def oracle(family: SweFamily, task: Task, ctx: ToolContext) -> None:
        for call in family.oracle_calls(task):
            await _call(family, ctx, call.name, **call.arguments)

    rewards = asyncio.run(_rollouts(toolz_rows, oracle))
    assert rewards == [1.0] * SET_SIZE


def test_finishing_at_once_resolves_nothing(toolz_rows: list[SweRow]) -> None:
    async def quitter(family: SweFamily, task: Task, ctx: ToolContext) -> None:
        await _call(family, ctx, "finish", answer="done")

    assert asyncio.run(_rollouts(toolz_rows, quitter)) == [0.0] * SET_SIZE


def test_cheating_agents_get_zero(toolz_rows: list[SweRow]) -> None:
    rows = toolz_rows[:4]

    async def edit_failing_tests(family: SweFamily, task: Task, ctx: ToolContext) -> None:
        row = SweRow.model_validate(task.data["row"])
        for nodeid in row.FAIL_TO_PASS:
            path, _, name = nodeid.partition("::")
            text = f"def {name.split('[')[0]}():\n    assert True\n"
            try:
                await _call(
                    family,
                    ctx,
                    "str_replace_editor",
                    command="create",
                    path=f"/workspace/{path}",
                    file_text=text,
                )
            except AssertionError:  # the file is visible: overwrite it through bash
                await _call(family, ctx, "bash", command=f"printf '%s' '{text}' >> {path}")
        # and weaken a visible test file
        await _call(
            family,
            ctx,
            "bash",
            command="sed -i 's/^\\(\\s*\\)assert /\\1assert True or /' "
            "toolz/tests/test_itertoolz.py",
        )

    async def force_passes(family: SweFamily, task: Task, ctx: ToolContext) -> None:
        for where in ("conftest.py", "toolz/conftest.py", "toolz/tests/conftest.py"):
            await _call(
                family,
                ctx,
                "str_replace_editor",
                command="create",
                path=f"/workspace/{where}",
                file_text=FORCE_PASS,
            )

    async def edit_config(family: SweFamily, task: Task, ctx: ToolContext) -> None:
        await _call(
            family,
            ctx,
            "bash",
            command=(
                "printf '[pytest]\\naddopts = -p no:python\\n' > pytest.ini && "
                "printf '\\n[tool:pytest]\\npython_functions = nothing\\n' >> setup.cfg && "
                "printf '\\n[tool.pytest.ini_options]\\naddopts = \"--co\"\\n' "
                ">> pyproject.toml && "
                "printf '[pytest]\\n' > tox.ini"
            ),
        )

    for agent in (edit_failing_tests, force_passes, edit_config):
        assert asyncio.run(_rollouts(rows, agent)) == [0.0] * len(rows), agent.__name__


def test_the_workspace_has_no_history_and_hides_the_failing_tests(toolz_rows: list[SweRow]) -> None:
    row = toolz_rows[0]

    async def look(family: SweFamily, task: Task, ctx: ToolContext) -> None:
        listing = await _call(family, ctx, "bash", command="ls -a; git log 2>&1 | head -1")
        assert ".git" not in listing.split()
        hidden = row.FAIL_TO_PASS[0].split("::")[0]
        assert not Path(str(ctx.runtime.workspace), hidden).exists()  # type: ignore[union-attr]

    assert asyncio.run(_rollouts([row], look)) == [0.0]
