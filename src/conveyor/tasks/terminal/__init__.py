"""The `terminal` family: Harbor / Terminal-Bench 2 task folders, solved with a shell.

Tasks are folders in the Harbor format (see `harbor`): our own shell and Python chores (12 chores x
12 variants: variant 00 of each shipped in `data/`, the rest written into the cache on first use,
all by `conveyor.tasks.terminal.chores`), plus any folders named by the `dirs`
option, run unchanged. Each rollout runs in bubblewrap when the folder's Dockerfile is a plain
base with only `COPY`/`WORKDIR`/`ENV` (`sandbox`), else in docker where an engine answers
(`docker_env`). A folder that can run in neither is an error when the family is built (option
`on_unrunnable: error`, the default) or skipped and counted in `skipped` (`skip`): never
silently dropped.

Tools: `bash(command)` (a fresh shell in the task's working folder per call; the per-command
timeout is the task's `[agent].timeout_sec`, at most `max_command_s`; output truncated to
`output_chars`) and `finish(answer="")`. Reward: after the rollout, the task's `tests/` run
against the final state (`run_verifier` / `DockerTaskRuntime.verify`); the agent never sees
them. Oracle: the folder's `solution/` written to `/tmp/solution` in `bash` calls of a few hundred
characters each (a turn's completion budget), `bash /tmp/solution/solve.sh`, then `finish`.

A task's split is a hash of its folder name (`split_of`), so no seed moves it between splits.

Options (`tasks.options.terminal`):
- `dirs` (list of paths, default []): more task folders, or folders of task folders;
- `shipped` (bool, default true): include the shipped chores;
- `on_unrunnable` (`error` | `skip`, default `error`): what a folder needing docker does where
  no container engine answers (or `runtime.kind` is `bubblewrap`);
- `max_command_s` (default 120): the cap on one `bash` call's time limit;
- `output_chars` (default 16000): characters of a command's output the agent sees;
- `docker` (default none: `runtime.engine`, podman where it answers, else docker): the
  container client to use, a name or a path;
- `base_images` (map, default: `python:3.11[-slim][-bookworm]`, `debian:bookworm[-slim]`,
  `debian:12[-slim]` to `conveyor-base`): the local image each registry image a Dockerfile's
  `FROM` names is built on (no registry is used; see `docker_env`); entries are added to the
  defaults, and a base neither mapped nor in the engine's store makes the folder unrunnable.

With a runtime kind that runs images (`docker`, or `container` where registered: any kind whose
spec has `needs_image`), every task runs in a container of its own image. The verifier has no
network unless `runtime.verifier_network` is true (containers only); without it, a verifier
that fails and needs network is an infrastructure error with its reason, never a reward of 0.

`check_tasks` is what `conveyor tasks check terminal` runs when neither `--n` nor `--split` is
given: every shipped folder (variant 00 of each chore) and every folder under `dirs`, whatever
its split.
"""

from __future__ import annotations

import base64
import logging
import shlex
import shutil
import tempfile
import typing
from importlib.resources import files
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import ToolContext, ToolRegistry, tool, truncate_output
from conveyor.config import RuntimeConfig
from conveyor.config.sections import AUTO
from conveyor.registry import RUNTIMES, UnknownName
from conveyor.runtime.base import Runtime, RuntimeFailure, RuntimeWrapper
from conveyor.runtime.cpu_pools import run_in_pool
from conveyor.runtime.docker import DockerRuntime
from conveyor.runtime.engine import Engine, engine_available, engine_of, resolve_engine
from conveyor.runtime.selection import started
from conveyor.runtime.workspace import Workspace, make_workspace, sweep_stale
from conveyor.tasks.family import (
    SPLIT_SHARES,
    FamilyServices,
    Grade,
    check_split,
    family_options,
    instance_task,
    opening,
    register_family,
    shuffled_pool,
    split_of,
)
from conveyor.tasks.terminal.chores import SHIPPED_VARIANTS, VARIANTS, write_folders
from conveyor.tasks.terminal.docker_env import (
    DEFAULT_BASE_IMAGES,
    DockerTaskRuntime,
    unresolved_base,
)
from conveyor.tasks.terminal.harbor import HarborTask, find_task_dirs, load_task
from conveyor.tasks.terminal.sandbox import (
    TerminalSandbox,
    VerifierResult,
    cache_root,
    network_failure,
    run_verifier,
    template_for,
)
from conveyor.types import Task, ToolCall, Trajectory

log = logging.getLogger(__name__)

SOLUTION_AT = "/tmp/solution"
# Characters of a solution file per oracle call: with the call's JSON escaping it stays within
# the default completion budget (agent.max_completion_tokens: 256) of the embedded tokenizer.
ORACLE_CHUNK_CHARS = 300
# Set-up around the verifier's own time limit: the tests' copy and the sandbox's start.
_GRADING_SETUP_S = 60.0
_SWEPT: set[Path] = set()


def shipped_dir() -> Path:
    """The folder of the shipped task folders (variant 00 of each chore)."""
    return Path(str(files("conveyor.tasks.terminal") / "data"))


def generated_dir() -> Path:
    """The chores' other variants (01 ..), written by `conveyor.tasks.terminal.chores` into the
    cache once per family version and moved into place whole, so a crash or a concurrent
    process never leaves a half-written set behind."""
    root = cache_root() / f"chores-v{TerminalFamily.version}-{SHIPPED_VARIANTS}-{VARIANTS}"
    if not root.is_dir():
        staging = Path(tempfile.mkdtemp(prefix=f"{root.name}.", dir=root.parent))
        write_folders(staging, variants=VARIANTS, first=SHIPPED_VARIANTS)
        try:
            staging.rename(root)
        except OSError:  # another process was first: its copy is the same
            shutil.rmtree(staging, ignore_errors=True)
    return root


class TerminalOptions(BaseModel):
    """`tasks.options.terminal` (see the module doc)."""

    model_config = ConfigDict(extra="forbid")

    dirs: list[Path] = Field(default_factory=list)
    shipped: bool = True
    on_unrunnable: Literal["error", "skip"] = "error"
    max_command_s: float = Field(120.0, gt=0)
    output_chars: int = Field(16000, ge=200)
    docker: str | None = None
    base_images: dict[str, str] = Field(
        default_factory=dict,
        description="Registry image (as a Dockerfile's FROM names it) -> local image to build "
        "on instead ('conveyor-base': the base image of `conveyor images base`); added to the "
        "defaults, which map python:3.11[-slim] and debian:bookworm to conveyor-base.",
    )


def _system_prompt() -> str:
    example = format_tool_call(ToolCall(name="bash", arguments={"command": "ls -la"}), "hermes")
    done = format_tool_call(ToolCall(name="finish", arguments={}), "hermes")
    return (
        "You are working in a Linux terminal, in the task's working folder. Use the bash tool "
        "to look around, run programs and change files: each call runs in a fresh shell in the "
        "working folder (cd and variables do not carry over; files do), without network. Make "
        "one call per message and wait for its result. Call a tool exactly like this:\n"
        f"{example}\n"
        "When the task is done, call finish:\n"
        f"{done}"
    )


SYSTEM_PROMPT = _system_prompt()


@tool
async def bash(command: str, ctx: ToolContext) -> str:
    """Run a bash command in the task's working folder and return its output and exit code.

    Args:
        command: The command, e.g. `ls -la` or `python3 script.py`.
    """
    runtime = ctx.runtime
    if runtime is None:
        raise RuntimeFailure("the terminal tools need a runtime, and this rollout has none")
    timeout_s = float(ctx.task.data["command_timeout_s"])
    result = await runtime.exec(command, timeout_s)
    output = result.stdout
    if result.stderr:
        output += ("" if not output or output.endswith("\n") else "\n") + result.stderr
    output = truncate_output(output, int(ctx.task.data["output_chars"]))
    if result.timed_out:
        raise TimeoutError(f"the command timed out after {timeout_s:g} s and was killed:\n{output}")
    return f"{output}[exit code: {result.exit_code}]"


@tool
async def finish(ctx: ToolContext, answer: str = "") -> str:
    """Say the task is done and end it. Call this once, when you are done.

    Args:
        answer: An optional note on what you did.
    """
    ctx.state["finished"] = True
    ctx.state["answer"] = answer
    return "Finished."


class TerminalRuntime(RuntimeWrapper[TerminalSandbox]):
    """A rollout's sandbox over a workspace it owns (removed on close), and the task's verifier."""

    def __init__(self, inner: TerminalSandbox, workspace: Workspace, task: HarborTask) -> None:
        super().__init__(inner)
        self.task_workspace = workspace
        self.task = task

    @property
    def root(self) -> str:
        """Where commands see the workspace (the Dockerfile's WORKDIR)."""
        return self.inner.root

    async def verify(self) -> VerifierResult:
        """Run the task's tests against the workspace, in a fresh sandbox (which has no
        network: a verifier that fails for want of it is a `RuntimeFailure`)."""
        result = await run_verifier(self.task, self.task_workspace.path, self.inner.limits)
        reason = network_failure(self.task, result)
        if reason is not None:
            raise RuntimeFailure(
                f"the verifier of {self.task.name} needs network, and bubblewrap gives it none "
                f"(a runtime kind that runs images does, with runtime.verifier_network): {reason}"
            )
        return result

    async def close(self) -> None:
        """Close the sandbox, then remove the workspace."""
        try:
            await self.inner.close()
        finally:
            await run_in_pool("init", self.task_workspace.remove)


def terminal_reward_budget_s(options: TerminalOptions) -> float | None:
    """The longest grading may take: the slowest verifier's limit among the task folders the
    options name, plus set-up (read from their task.toml files; nothing is built). None when a
    folder cannot be read: the family refuses it when the run builds it."""
    try:
        tasks = [load_task(folder) for folder in task_folders(options)]
    except ValueError:
        return None
    slowest = max((t.verifier_timeout_s for t in tasks), default=0.0)
    return slowest + _GRADING_SETUP_S


def task_folders(options: TerminalOptions) -> list[Path]:
    """The Harbor task folders `options` name: the shipped ones (unless `shipped: false`) and
    every folder under `dirs`."""
    roots = [shipped_dir(), generated_dir()] if options.shipped else []
    roots += [Path(p).expanduser() for p in options.dirs]
    return [folder for root in roots for folder in find_task_dirs(root)]


def _runs_images(kind: str) -> bool:
    """Whether the runtime `kind` names runs container images, so that a task folder can run
    in its own image: its spec needs an image (`needs_image`: docker), or its build makes a
    `DockerRuntime` (container, which takes the image the family names). A kind not
    registered (yet) runs none."""
    if kind == AUTO:
        return False
    try:
        spec = RUNTIMES.spec(kind)
    except UnknownName:
        return False
    if spec.needs_image:
        return True
    try:
        made = typing.get_type_hints(spec.build).get("return")
    except (NameError, TypeError):  # annotations that do not resolve: no claim
        return False
    return isinstance(made, type) and issubclass(made, DockerRuntime)


@register_family(options=TerminalOptions, reward_budget_s=terminal_reward_budget_s)
class TerminalFamily:
    """Harbor task folders solved with `bash`; see the module doc."""

    name = "terminal"
    runtimes: tuple[str, ...] = ("bubblewrap", "docker", "container")
    source = "Harbor task folders: our shipped chores, plus tasks.options.terminal.dirs"
    version = "1"
    splits = tuple(SPLIT_SHARES)

    def __init__(
        self, runtime: RuntimeConfig | None = None, services: FamilyServices | None = None
    ) -> None:
        self.runtime = runtime if runtime is not None else RuntimeConfig()
        kind = self.runtime.kind
        if kind not in (AUTO, self.runtimes[0]) and not _runs_images(kind):
            raise ValueError(
                f"task family 'terminal' cannot use runtime.kind {kind!r}; it supports "
                "bubblewrap and the kinds that run images (docker, container) (auto: "
                "bubblewrap, docker where needed)"
            )
        options = (services or FamilyServices()).options
        self.options = family_options(self.name, TerminalOptions, options)
        self.base_images = {**DEFAULT_BASE_IMAGES, **self.options.base_images}
        self.tasks: dict[str, HarborTask] = {}
        self.kinds: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        for folder in self._folders():
            self._add(load_task(folder))
        if self.skipped:
            log.warning("terminal: skipped %d task folders: %s", len(self.skipped), self.skipped)
        offline = [
            name
            for name, task in self.tasks.items()
            if task.network_fetches
            and task.verifier_network_mode != "no-network"
            and not (self.runtime.verifier_network and _runs_images(self.kinds[name]))
        ]
        if offline:
            log.warning(
                "terminal: %d task folders' verifiers fetch from the network, which they do not "
                "get here (runtime.verifier_network, with a kind that runs images): their "
                "failures are infrastructure errors, not rewards: %s",
                len(offline),
                offline[:10],
            )

    @property
    def reward_budget_s(self) -> float:
        """The longest grading may take: the slowest verifier's limit plus set-up."""
        slowest = max((t.verifier_timeout_s for t in self.tasks.values()), default=0.0)
        return slowest + _GRADING_SETUP_S

    def _folders(self) -> list[Path]:
        return task_folders(self.options)

    def _add(self, task: HarborTask) -> None:
        if task.name in self.tasks:
            raise ValueError(
                f"terminal: two task folders are named {task.name!r}: "
                f"{self.tasks[task.name].path} and {task.path}"
            )
        kind, reason = self._kind_for(task)
        if kind is None:
            message = f"terminal: task folder {task.path} cannot run here: {reason}"
            if self.options.on_unrunnable == "error":
                raise ValueError(
                    f"{message} (set tasks.options.terminal.on_unrunnable: skip to skip it)"
                )
            self.skipped[task.name] = reason
            return
        self.tasks[task.name] = task
        self.kinds[task.name] = kind

    def _kind_for(self, task: HarborTask) -> tuple[str | None, str]:
        """The runtime kind for `task`, or None and why it has none here."""
        needs_docker = task.environment.docker_reason
        chosen = self.runtime.kind
        if not _runs_images(chosen) and needs_docker is None:
            return self.runtimes[0], ""  # the sandbox over the task folder, the default
        if chosen != AUTO and not _runs_images(chosen):  # named, and it runs no image
            return None, f"it needs docker ({needs_docker}) and runtime.kind is {chosen}"
        ok, why = engine_available(self.engine)
        if not ok:
            need = needs_docker or f"runtime.kind is {chosen}"
            return None, f"it needs docker ({need}), and {self.engine.name} is not usable: {why}"
        missing = unresolved_base(task, self.base_images, self.engine)
        if missing is not None:
            return None, missing
        if _runs_images(chosen):
            return chosen, ""
        return next(kind for kind in self.runtimes if _runs_images(kind)), ""

    @property
    def engine(self) -> Engine:
        """The container engine of task images: the `docker` option's client, else
        `runtime.engine`."""
        if self.options.docker:
            return engine_of(self.options.docker)
        return resolve_engine(self.runtime.engine)

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` task folders of `split` in a seed-shuffled order; `ValueError` if there are
        fewer."""
        check_split(split)
        names = shuffled_pool(
            self.name,
            sorted(name for name in self.tasks if split_of(name) == split),
            n,
            seed,
            split,
            lambda held: (
                f"terminal: only {held} '{split}' task folders (of {len(self.tasks)}); "
                f"asked for {n}"
            ),
        )
        return [self._task(self.tasks[name], split, i) for i, name in enumerate(names)]

    def _task(self, harbor: HarborTask, split: str, index: int) -> Task:
        workdir = harbor.environment.workdir or "the task's working folder"
        return instance_task(
            self.name,
            split,
            index,
            opening(SYSTEM_PROMPT, f"{harbor.instruction.strip()}\n\n(Working folder: {workdir})"),
            {
                "name": harbor.name,
                "kind": self.kinds[harbor.name],
                "command_timeout_s": min(harbor.agent_timeout_s, self.options.max_command_s),
                "output_chars": self.options.output_chars,
            },
            name=harbor.name,
        )

    def check_tasks(self) -> list[Task]:
        """Every shipped folder and every folder under `dirs` (not the generated variants),
        each of its own split: what `conveyor tasks check terminal` runs by default."""
        roots = [shipped_dir()] if self.options.shipped else []
        roots += [Path(p).expanduser() for p in self.options.dirs]
        names = [load_task(f).name for root in roots for f in find_task_dirs(root)]
        return [
            self._task(self.tasks[name], split_of(name), index)
            for index, name in enumerate(names)
            if name in self.tasks
        ]

    def image_runtimes(self) -> list[DockerTaskRuntime]:
        """An unstarted container runtime of every task folder that runs in its own image
        under this config, by name: what `conveyor images build` builds ahead of a run."""
        return [
            DockerTaskRuntime(
                self.tasks[name],
                limits=None,
                docker=self.engine,
                base_images=self.base_images,
                verifier_network=self.runtime.verifier_network,
            )
            for name in sorted(self.tasks)
            if _runs_images(self.kinds[name])
        ]

    def tools(self) -> ToolRegistry:
        """`bash` and `finish`."""
        return ToolRegistry([bash, finish])

    def _harbor(self, task: Task) -> HarborTask:
        name = task.data["name"]
        if name not in self.tasks:
            raise ValueError(f"terminal: no task folder named {name!r} in this family")
        return self.tasks[name]

    async def make_runtime(self, task: Task) -> Runtime:
        """A started sandbox (or container) holding the task's starting state."""
        harbor = self._harbor(task)
        if _runs_images(self.kinds[harbor.name]):
            docker = DockerTaskRuntime(
                harbor,
                limits=None,
                docker=self.engine,
                base_images=self.base_images,
                verifier_network=self.runtime.verifier_network,
            )
            return await started(docker)
        template = await run_in_pool("init", template_for, harbor)
        workspace = await run_in_pool(
            "init",
            make_workspace,
            template,
            await _workspace_root(),
            size_bytes=self.runtime.workspace_size_bytes,
        )
        sandbox = TerminalSandbox(
            workspace.path, harbor.environment.workdir, env=harbor.environment.env
        )
        runtime = TerminalRuntime(sandbox, workspace, harbor)
        try:
            await started(runtime)
        except BaseException:
            await runtime.close()
            raise
        return runtime

    async def grade(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Grade:
        """Run the task's tests after the rollout; the reward is what they say."""
        result = await _verify(runtime)
        return Grade(
            reward=result.reward,
            breakdown={
                "verifier_exit_code": float(result.exit_code),
                "verifier_timed_out": float(result.source == "timeout"),
            },
            records=[
                {
                    "role": "verifier",
                    "content": f"reward {result.reward:g} from {result.source} "
                    f"(exit code {result.exit_code})\n{result.output[-2000:]}",
                }
            ],
        )

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """The verifier's reward (the answer plays no part)."""
        return (await _verify(runtime)).reward

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """The folder's `solution/` written to `/tmp/solution`, `solve.sh` run, then finish."""
        return [
            *solution_calls(self._harbor(task)),
            ToolCall(name="finish", arguments={"answer": "ran the reference solution"}),
        ]


def solution_calls(task: HarborTask, chunk_chars: int = ORACLE_CHUNK_CHARS) -> list[ToolCall]:
    """`bash` calls that recreate `solution/` under /tmp/solution, a piece of at most
    `chunk_chars` characters per call (each call must fit one turn's completion budget), then
    run `solve.sh`."""
    calls: list[str] = []
    root = task.solution_dir
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        target = shlex.quote(f"{SOLUTION_AT}/{path.relative_to(root).as_posix()}")
        data = path.read_bytes()
        try:
            text, decode = data.decode(), ""
        except UnicodeDecodeError:
            text, decode = base64.b64encode(data).decode(), " | base64 -d"
        pieces = [text[i : i + chunk_chars] for i in range(0, len(text), chunk_chars)] or [""]
        for index, piece in enumerate(pieces):
            write = f"printf %s {shlex.quote(piece)}{decode} {'>' if index == 0 else '>>'} {target}"
            if index == 0:
                write = f'mkdir -p "$(dirname {target})" && {write}'
            calls.append(write)
    calls.append(f"bash {SOLUTION_AT}/solve.sh")
    return [ToolCall(name="bash", arguments={"command": command}) for command in calls]


async def _verify(runtime: Runtime) -> VerifierResult:
    if not isinstance(runtime, TerminalRuntime | DockerTaskRuntime):
        raise RuntimeFailure("terminal grading needs the family's own runtime (with verify)")
    return await runtime.verify()


async def _workspace_root() -> Path:
    """Where rollout workspaces go; workspaces a crashed process left are swept on first use."""
    root = cache_root() / "workspaces"
    if root not in _SWEPT:
        _SWEPT.add(root)
        await run_in_pool("init", sweep_stale, root)
    return root
