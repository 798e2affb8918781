"""The `swe` task family: SWE-bench-format rows of `pypi:` projects, solved in a sandbox.

Options (`tasks.options.swe`, `SweOptions` in `swe.options`): `rows`, the row files (paths or
task set names; recorded in the run's `config.yaml` with their content hashes), and `grading`
(`GradingOptions`: semantics, timeouts, the grading runtime). Without `rows`, the rows come
from the JSONL/parquet files in `$CONVEYOR_SWE_TASKS` (paths separated by `:`), by default every
`*.jsonl` under `<swe_home>/tasks` (where `conveyor tasks build --out` puts them in the docs'
examples). An instance's split is a hash of its `instance_id` (`split_of`), so no seed moves a
task between splits.

Per rollout (`make_runtime`): an overlay workspace of the task's starting state, a runtime of
`runtime.kind` over it (bubblewrap by default; local or docker) with the project's test venv
mounted read-only, or (kind `container`) a container of the row's own image (`swe.images`:
the test venv inside it, the workspace at /testbed; the grader's tests run in it too, and a
run refuses to start while an image is missing), and the task's code index (built once per
starting state, shared, cached on disk) attached to the runtime for the `search_code` tool.
The blocking set-up runs on the `init` CPU pool. `grade` grades the workspace's diff with
`grading.grade` (a `Grade` whose breakdown has `resolved` and `tampered`; `score` is its
reward alone); `oracle_calls` applies the gold patch through `str_replace_editor` edits,
then finishes.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conveyor.agent.tools import ToolContext, ToolRegistry, finish, tool
from conveyor.config import RuntimeConfig
from conveyor.runtime.base import Runtime, RuntimeWrapper
from conveyor.runtime.cpu_pools import run_in_pool
from conveyor.runtime.docker import CONTAINER_WORKDIR
from conveyor.runtime.selection import RuntimeRequest, build_runtime, started
from conveyor.runtime.workspace import Workspace, make_workspace, sweep_stale
from conveyor.tasks.family import (
    Grade,
    check_split,
    family_options,
    instance_task,
    opening,
    register_family,
    runtime_choice,
    shuffled_pool,
    split_of,
)
from conveyor.tasks.swe import canaries
from conveyor.tasks.swe.codesearch.index import CodeIndex, IndexCache
from conveyor.tasks.swe.codesearch.tool import search_code
from conveyor.tasks.swe.dataset import SweRow, load_rows
from conveyor.tasks.swe.environment import swe_home
from conveyor.tasks.swe.grading import (
    UNSANDBOXED_WARNING,
    grade_runtime,
    row_container,
    row_environment,
    row_metadata,
    row_template,
    test_env_vars,
)
from conveyor.tasks.swe.hints import SweHintPolicy
from conveyor.tasks.swe.images import check_images
from conveyor.tasks.swe.options import TASKS_ENV, SweOptions, default_row_files, resolve_swe_options
from conveyor.tasks.swe.patches import apply_patch, file_diff, patch_paths, read_text, split_lines
from conveyor.tasks.swe.tools import make_bash_tool, str_replace_editor
from conveyor.types import FamilyServices, Task, ToolCall, Trajectory

log = logging.getLogger(__name__)
BASH_TIMEOUT_S = 60.0
SWE_INDEXES = IndexCache(max_entries=16)
# Workspace roots swept of what crashed processes left, once per process.
_SWEPT_ROOTS: set[Path] = set()

SYSTEM_PROMPT = (
    "You are a software engineer fixing an issue in the Python repository at /workspace. "
    "Tools: `bash` (a sandboxed shell in /workspace, no network; run tests with "
    "`python -m pytest`), `str_replace_editor` (view files, edit with str_replace or insert), "
    "`search_code` (find definitions, callers and code by name or description) and `finish`. "
    "Make one tool call per message. Find the cause, edit the library code (not the tests), "
    "check your fix, then call `finish` with a one-line summary."
)


def task_files() -> list[Path]:
    """The row files a family without `tasks.options.swe.rows` reads (see the module doc)."""
    return default_row_files()


class SweRuntime(RuntimeWrapper[Runtime]):
    """A rollout's runtime over a task workspace it owns (removed on close), with the task's
    row and code index. The commands run in `inner`, a runtime of the configured kind."""

    def __init__(self, inner: Runtime, workspace: Workspace, row: SweRow) -> None:
        super().__init__(inner)
        self.task_workspace = workspace
        self.row = row
        self.code_index: CodeIndex | None = None

    @property
    def workspace(self) -> Path:
        """The host folder the rollout's edits land in (what the grader diffs)."""
        return self.task_workspace.path

    async def close(self) -> None:
        """Close the inner runtime, then remove the workspace."""
        try:
            await self.inner.close()
        finally:
            await run_in_pool("init", self.task_workspace.remove)


@tool(name="search_code", timeout_s=120)
async def swe_search_code(query: str, kind: str = "auto", *, ctx: ToolContext) -> str:
    """Search the Python code: definitions by name, their uses and callers, or code by description.

    Args:
        query: A name (parse_config, Parser.parse or pkg.mod.func; typos and partial names are
            fine) or a short description of the behaviour you are looking for.
        kind: auto (names, or a text search when the query is a description), definition,
            references (every use of a name across modules), callers (the functions that call
            it) or text (keyword search over names, docstrings and code).
    """
    runtime = ctx.runtime
    index = getattr(runtime, "code_index", None)
    if index is not None:
        ctx.state.setdefault("code_index", index)
    workspace = getattr(runtime, "workspace", None)
    if workspace is not None:
        ctx.state.setdefault("workspace_root", str(workspace))
    return str(await search_code.invoke({"query": query, "kind": kind}, ctx))


# The name of the grade record that carries the graded patch (`app.evaluate` reads it).
PREDICTION_RECORD = "swebench_prediction"

# Workspace copy, patch application and sandbox start around the graded test run (seconds).
GRADING_SETUP_S = 60.0


def swe_reward_budget_s(options: SweOptions) -> float:
    """The longest `score` may legitimately take: the configured test run's limit
    (`grading.run_timeout_s`) plus set-up (the config check refuses a reward-stage timeout
    below it)."""
    return options.grading.run_timeout_s + GRADING_SETUP_S


@register_family(options=SweOptions, reward_budget_s=swe_reward_budget_s)
class SweFamily:
    """SWE tasks from factory (or user-supplied `pypi:`) rows; see the module doc."""

    name = "swe"
    # The kinds a rollout can run in (the first is auto's): a workspace on this host, with
    # commands sandboxed, plain or in a container.
    runtimes: tuple[str, ...] = ("bubblewrap", "local", "docker", "container")

    @property
    def reward_budget_s(self) -> float:
        """The longest `score` may legitimately take (`swe_reward_budget_s`)."""
        return swe_reward_budget_s(self.options)

    hint_policy = SweHintPolicy

    def __init__(
        self, runtime: RuntimeConfig | None = None, services: FamilyServices | None = None
    ) -> None:
        self.runtime, self.runtime_kind = runtime_choice(self.name, runtime, self.runtimes)
        options = services.options if services is not None else {}
        self.options = family_options(self.name, SweOptions, options)
        self.grading = self.options.grading
        # Under kind 'container' the grader's tests run in the row's container too.
        in_containers = self.runtime_kind == "container" and self.grading.runtime == "auto"
        if in_containers or self.grading.runtime == "container":
            self.grading = self.grading.in_containers(self.runtime)
        if self.grading.unsandboxed:
            log.warning(UNSANDBOXED_WARNING)

    @classmethod
    def resolve_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """`tasks.options.swe` as the run uses and records it (`swe.options.resolve_swe_options`:
        rows as absolute paths with content hashes, every grading key)."""
        return resolve_swe_options(options)

    def row_files(self) -> list[Path]:
        """The row files this family reads: `tasks.options.swe.rows` (each checked unchanged
        since the config recorded it), else `task_files()`."""
        if self.options.rows is not None:
            return [rows.check_unchanged() for rows in self.options.rows]
        return task_files()

    def rows(self) -> list[SweRow]:
        """Every row of the configured files, in file order."""
        rows: list[SweRow] = []
        for path in self.row_files():
            rows += load_rows(path)
        return rows

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` rows of `split` in a seed-shuffled order; `ValueError` if there are fewer."""
        check_split(split)
        rows = sorted(
            (r for r in self.rows() if split_of(r.instance_id) == split),
            key=lambda r: r.instance_id,
        )

        def shortage(held: int) -> str:
            files = ", ".join(str(p) for p in self.row_files()) or (
                f"none (set tasks.options.swe.rows, or ${TASKS_ENV})"
            )
            return f"swe: only {held} '{split}' tasks in {files}; asked for {n}"

        chosen = shuffled_pool(self.name, rows, n, seed, split, shortage)
        if self.runtime_kind == "container" or self.grading.runtime == "container":
            # Refuse to start rather than build images inside the first step.
            check_images(chosen, self.grading.container_settings)
        return [self.task(row, split, i) for i, row in enumerate(chosen)]

    @property
    def root(self) -> str:
        """Where the task's repository shows to the policy."""
        return CONTAINER_WORKDIR if self.runtime_kind == "container" else "/workspace"

    def task(self, row: SweRow, split: str = "eval", index: int = 0) -> Task:
        """The `Task` of one row."""
        return instance_task(
            self.name,
            split,
            index,
            opening(SYSTEM_PROMPT.replace("/workspace", self.root), row.problem_statement),
            {"row": row.model_dump(mode="json")},
            name=row.instance_id,
        )

    def tools(self) -> ToolRegistry:
        """`bash`, `str_replace_editor`, `search_code` and `finish`."""
        return ToolRegistry(
            [make_bash_tool(BASH_TIMEOUT_S), str_replace_editor, swe_search_code, finish]
        )

    async def make_runtime(self, task: Task) -> Runtime:
        """A started runtime over a fresh workspace of the task, its code index attached."""
        row = SweRow.model_validate(task.data["row"])
        template = await run_in_pool("init", row_template, row)
        workspace = await run_in_pool(
            "init",
            make_workspace,
            template,
            await _workspace_root(),
            size_bytes=self.runtime.workspace_size_bytes,
        )
        try:
            request = await run_in_pool("init", self._runtime_request, row, workspace)
            inner = build_runtime(self.runtime_kind, request, self.runtime)
        except BaseException:
            await run_in_pool("init", workspace.remove)
            raise
        runtime = SweRuntime(inner, workspace, row)
        try:
            await started(runtime)
            runtime.code_index = await run_in_pool("init", SWE_INDEXES.get, template)
            # The row's canaries are validated (one gold run, cached per row) while the runtime
            # is made, so the first rollout's reward stage stays within its grading budget.
            await canaries.row_canaries(row, self.grading)
        except BaseException:
            await runtime.close()
            raise
        return runtime

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """The grader's reward for the workspace's diff (1.0 resolved, else 0.0 or partial).

        Raises `TaskDefect` when the row's hidden test patch does not apply to its own starting
        state: the task is broken, the run stops (never a score, never retried)."""
        row = SweRow.model_validate(task.data["row"])
        report = await grade_runtime(row, runtime, self.grading)
        return report.reward

    async def grade(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Grade:
        """`score`'s verdict with its parts: `resolved` and `tampered` (1 when the test process
        forged its outcomes: a canary test passed, or the bootstrap saw tampering), which the
        run's metrics carry as `reward/resolved` and `reward/tampered`; the report as a record.

        Raises `TaskDefect` as `score` does."""
        row = SweRow.model_validate(task.data["row"])
        report = await grade_runtime(row, runtime, self.grading)
        verdict = "resolved" if report.resolved else "not resolved"
        if report.tampered:
            verdict += f", tampered ({report.violations[-1] if report.violations else '?'})"
        elif report.error:
            verdict += f" ({report.error})"
        content = (
            f"SWE grade: {verdict}; F2P {report.f2p_passed}/{report.f2p_total}, "
            f"P2P {report.p2p_passed}/{report.p2p_total}"
        )
        return Grade(
            reward=report.reward,
            breakdown={"resolved": float(report.resolved), "tampered": float(report.tampered)},
            records=[
                # The graded patch, for `conveyor eval`'s SWE-bench `predictions.jsonl`; the
                # verdict stays the last record.
                {
                    "role": "grader",
                    "name": PREDICTION_RECORD,
                    "instance_id": row.instance_id,
                    "content": report.model_patch or "",
                },
                {"role": "grader", "content": content},
            ],
        )

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """The gold patch as editor calls (one `str_replace` per hunk), then `finish`."""
        row = SweRow.model_validate(task.data["row"])
        return [
            *gold_edits(row, row_template(row), self.root),
            ToolCall(name="finish", arguments={"answer": "Fixed the bug (gold patch applied)."}),
        ]

    def _runtime_request(self, row: SweRow, workspace: Workspace) -> RuntimeRequest:
        """`_runtime_request`; under kind 'container', the row's own image with the test
        environment inside it (nothing of the host mounted but the workspace)."""
        if self.runtime_kind != "container":
            return _runtime_request(row, workspace)
        target = row_container(row, self.grading)
        env = row_environment(row, self.grading)
        metadata = row_metadata(row, self.grading)

        def env_at(root: str) -> dict[str, str]:
            return test_env_vars(env, root, row.env.pythonpath, metadata)

        return RuntimeRequest(workspace=workspace.path, env_at=env_at, image=target.image)


async def _workspace_root() -> Path:
    """Where rollout workspaces go; on first use in this process, workspaces whose creating
    process died (a crash, a kill) are removed, so they cannot pile up on the disk."""
    root = swe_home() / "workspaces"
    if root not in _SWEPT_ROOTS:
        _SWEPT_ROOTS.add(root)
        await run_in_pool("init", sweep_stale, root)
    return root


def _runtime_request(row: SweRow, workspace: Workspace) -> RuntimeRequest:
    """The workspace with the row's test venv and project metadata mounted read-only, and the
    variables that make the agent's shell use them."""
    env = row_environment(row)
    metadata = row_metadata(row)

    def env_at(root: str) -> dict[str, str]:
        return test_env_vars(env, root, row.env.pythonpath, metadata)

    return RuntimeRequest(
        workspace=workspace.path,
        env_dir=env.path,
        read_only=[metadata] if metadata is not None else [],
        env_at=env_at,
    )


def gold_edits(row: SweRow, template: Path, root: str = "/workspace") -> list[ToolCall]:
    """Editor calls that turn the starting state into starting state + gold patch.

    The files the gold patch touches (as git reads it) are copied from the starting state to a
    scratch folder, the patch is applied there with git and the files are read back byte for
    byte: a new file is created, a changed one edited with one `str_replace` per hunk of its
    diff (the whole text where a hunk's old text is not unique). A deleted file is emptied (the
    editor cannot delete), a binary one left alone."""
    calls: list[ToolCall] = []
    paths = sorted(patch_paths(row.patch))
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for rel in paths:
            if (template / rel).is_file():
                (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(template / rel, scratch / rel)
        apply_patch(scratch, row.patch)
        for rel in paths:
            old_path, new_path = template / rel, scratch / rel
            old = read_text(old_path) if old_path.is_file() else None
            new = read_text(new_path) if new_path.is_file() else ""
            if new is None or (old is None and old_path.is_file()) or old == new:
                continue  # unchanged, or a binary file: the editor edits text
            path = f"{root}/{rel}"
            if old is None:
                calls.append(_edit("create", path, file_text=new))
                continue
            for old_str, new_str in _hunks(file_diff(rel, old, new)):
                if old_str and old.count(old_str) == 1:
                    calls.append(_edit("str_replace", path, old_str=old_str, new_str=new_str))
                    old = old.replace(old_str, new_str, 1)
            if old != new:  # hunks were not unique: replace the whole file's text
                calls.append(_edit("str_replace", path, old_str=old, new_str=new))
    return calls


def _edit(command: str, path: str, **arguments: Any) -> ToolCall:
    return ToolCall(
        name="str_replace_editor", arguments={"command": command, "path": path, **arguments}
    )


def _hunks(text: str) -> list[tuple[str, str]]:
    """(old, new) text of each hunk of one file's diff (lines split at "\\n" only)."""
    hunks: list[tuple[list[str], list[str]]] = []
    sign = " "
    for line in split_lines(text):
        if line.startswith("@@"):
            hunks.append(([], []))
        elif hunks and line.startswith("\\"):
            old, new = hunks[-1]
            for side, signs in ((old, " -"), (new, " +")):
                if sign in signs and side and side[-1].endswith("\n"):
                    side[-1] = side[-1][:-1]
        elif hunks and line[:1] in (" ", "-", "+"):
            old, new = hunks[-1]
            sign = line[0]
            if sign in " -":
                old.append(line[1:])
            if sign in " +":
                new.append(line[1:])
    return [("".join(o), "".join(n)) for o, n in hunks]
