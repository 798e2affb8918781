"""A sandboxed Python executor: the `python(code)` tool and the runtime it runs in.

`start_executor_runtime` makes a fresh temporary workspace, builds a runtime of the configured
kind over it (`bubblewrap` by default: every command in its own sandbox with no network, as the
unprivileged sandbox user, under the `SandboxLimits`), writes the given files into it and starts
it; closing the runtime removes the workspace. Inside a run with `runtime.warm_pool`, it takes
instead such a runtime started ahead over an empty workspace (nothing of the task is in it
yet, so it is as good as new), then writes the files. The `python` tool writes the model's code
into that workspace and runs it with `python3` through `Runtime.exec`, with a time limit,
returning what it printed and its exit status (truncated). Model code never runs in our own
process.

Each call is a fresh interpreter: variables do not carry over between calls, files written under
the workspace do. As in a notebook, the value of a final bare expression is printed. The
interpreter is the one of the environment Conveyor runs in (its venv is mounted read-only), so
`sympy`, `mpmath`, `numpy` and the standard library are there.

Families using the executor list `EXECUTOR_RUNTIMES` to `choose_runtime`: `bubblewrap` (the
default) or `local` (plain subprocesses without isolation, for machines without bubblewrap; it
warns, and the sandbox guarantees graders rely on do not hold there).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from conveyor.agent.tools import Tool, ToolContext, tool, truncate_output
from conveyor.config import RuntimeConfig
from conveyor.registry import RUNTIMES
from conveyor.runtime.base import ExecResult, Runtime, RuntimeFailure, RuntimeWrapper
from conveyor.runtime.limits import SANDBOX_GID, SANDBOX_UID, SandboxLimits
from conveyor.runtime.selection import RuntimeRequest, build_runtime, choose_runtime, started
from conveyor.runtime.starts import active_starts

EXECUTOR_RUNTIMES: tuple[str, ...] = ("bubblewrap", "local")
"""The runtime kinds the executor can use; the first is `auto`'s."""

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_OUTPUT_CHARS = 8000
# Where the tool keeps the code of each call, relative to the workspace.
CELLS_DIR = ".cells"
_RUNNER = f"{CELLS_DIR}/_run.py"
# Seconds the tool's own deadline allows beyond the command's, for writing the file and the
# sandbox's start and kill.
_TOOL_GRACE_S = 15.0
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# Runs one cell: its code as __main__, then the value of a final bare expression, printed (as in
# a notebook). Runs inside the sandbox only.
_RUNNER_SOURCE = """\
import ast
import sys
path = sys.argv[1]
with open(path, encoding="utf-8") as handle:
    source = handle.read()
sys.argv = [path]
sys.path[0] = ""
scope = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
try:
    tree = ast.parse(source, path)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, path, "exec"), scope)
    if last is not None:
        value = eval(compile(last, path, "eval"), scope)
        if value is not None:
            print(repr(value))
except Exception as error:
    import traceback
    trace = None if isinstance(error, SyntaxError) else error.__traceback__.tb_next
    traceback.print_exception(type(error), error, trace)
    sys.exit(1)
"""


class CodeTimedOut(RuntimeError):
    """The code ran past its time limit and was killed (the policy's doing)."""


class ExecutorRuntime(RuntimeWrapper[Runtime]):
    """A started runtime over a temporary workspace it owns; `close` removes the workspace.

    Commands run in `inner`, a runtime of the chosen kind; `root` is where they see the
    workspace (`/workspace` in a sandbox, the host path for `local`).
    """

    def __init__(self, inner: Runtime, workspace: Path) -> None:
        super().__init__(inner)
        self.workspace = workspace

    @property
    def root(self) -> str:
        """The workspace as commands see it."""
        return str(getattr(self.inner, "root", self.workspace))

    async def exec(
        self, command: str, timeout_s: float, *, pass_fds: Sequence[int] = ()
    ) -> ExecResult:
        """Run a shell command in the inner runtime; `pass_fds` are host file descriptors the
        command inherits (bubblewrap and local runtimes only)."""
        if pass_fds:
            runner: Any = self.inner
            result: ExecResult = await runner.exec(command, timeout_s, pass_fds=pass_fds)
            return result
        return await self.inner.exec(command, timeout_s)

    async def close(self) -> None:
        """Close the inner runtime, then remove the workspace; safe to call more than once."""
        try:
            await self.inner.close()
        finally:
            shutil.rmtree(self.workspace, ignore_errors=True)


def executor_available(settings: RuntimeConfig | None = None) -> tuple[bool, str]:
    """Whether the executor's runtime kind can run here, and why not (its spec's `available`:
    bubblewrap needs `bwrap`, `setpriv`, `unshare` and `prlimit`, and a probe sandbox that
    starts)."""
    kind = choose_runtime("executor", settings or RuntimeConfig(), EXECUTOR_RUNTIMES)
    available = RUNTIMES.spec(kind).available
    if available is None:
        return True, f"{kind} runtime"
    return available()


def python_env_dir() -> Path | None:
    """The venv Conveyor runs in (mounted read-only for the sandboxed `python3`), if it is one."""
    return Path(sys.prefix) if sys.prefix != sys.base_prefix else None


async def start_executor_runtime(
    settings: RuntimeConfig,
    files: Mapping[str, str] | None = None,
    *,
    limits: SandboxLimits | None = None,
    env_dir: Path | bool | None = True,
    hidden: Sequence[Path] = (),
) -> Runtime:
    """A started runtime of `settings.kind` (auto: bubblewrap) over a fresh temporary workspace
    holding `files` (paths relative to the workspace, or absolute under its root), removed on
    close.

    `limits`: the sandbox's per-command limits (default `SandboxLimits()`, the SWE ones).
    `env_dir`: the Python environment mounted read-only (`True`: the one Conveyor runs in, see
    `python_env_dir`; `None`/`False`: the system's `python3`). `hidden`: host folders the
    sandbox sees empty (bubblewrap only: `ValueError` for another kind). `ValueError` for a
    runtime kind the executor cannot use; `RuntimeFailure` (naming what is missing) when the
    sandbox cannot start here, e.g. without `bwrap`.
    """
    kind = choose_runtime("executor", settings, EXECUTOR_RUNTIMES)
    available = RUNTIMES.spec(kind).available
    if available is not None:
        ok, reason = available()
        if not ok:
            raise RuntimeFailure(
                f"the Python executor needs {kind}, which is not usable here: {reason}; "
                f"install it (apt-get install {kind}) or set runtime.kind: local "
                "(no isolation)"
            )
    environment = python_env_dir() if env_dir is True else (env_dir or None)
    env_path = environment if isinstance(environment, Path) else None
    sandbox_limits = limits or SandboxLimits()
    masked = tuple(Path(path) for path in hidden)

    def blank() -> ExecutorRuntime:
        return _blank_runtime(kind, settings, env_path, sandbox_limits, masked)

    starts = active_starts()
    if starts is None:
        runtime: Runtime = await started(blank())
    else:
        # Nothing of the task is in a blank runtime, so one started ahead is as good as new.
        recipe = ("executor", kind, settings, env_path, sandbox_limits, masked)
        runtime = await starts.warm(recipe, blank)
    try:
        for path, content in (files or {}).items():
            await runtime.write_file(path, content)
    except BaseException:
        await runtime.close()
        raise
    return runtime


def _blank_runtime(
    kind: str,
    settings: RuntimeConfig,
    env_dir: Path | None,
    limits: SandboxLimits,
    hidden: Sequence[Path],
) -> ExecutorRuntime:
    """A not yet started executor runtime over a fresh empty workspace (removed on close)."""
    workspace = Path(tempfile.mkdtemp(prefix="conveyor-exec-"))
    try:
        if os.geteuid() == 0:
            os.chown(workspace, SANDBOX_UID, SANDBOX_GID)
        request = RuntimeRequest(
            workspace=workspace,
            env_dir=env_dir,
            env_at=_env_at(env_dir),
            limits=limits,
            hidden=tuple(hidden),
        )
        # `ValueError` for hidden folders and a kind whose spec cannot hide paths.
        inner = build_runtime(kind, request, settings)
    except BaseException:
        shutil.rmtree(workspace, ignore_errors=True)
        raise
    return ExecutorRuntime(inner, workspace)


def _env_at(env_dir: Path | None) -> Callable[[str], dict[str, str]]:
    """The variables that put `env_dir`'s interpreter first on PATH (for every runtime kind)."""

    def env_at(root: str) -> dict[str, str]:
        if env_dir is None:
            return {}
        return {"PATH": f"{env_dir / 'bin'}:{_DEFAULT_PATH}"}

    return env_at


def format_result(result: ExecResult, max_chars: int) -> str:
    """What the model sees of a run: stdout, then stderr (marked), then the exit status."""
    parts = [result.stdout]
    if result.stderr:
        gap = "" if not result.stdout or result.stdout.endswith("\n") else "\n"
        parts.append(f"{gap}[stderr]\n{result.stderr}")
    text = truncate_output("".join(parts), max_chars)
    end = "" if not text or text.endswith("\n") else "\n"
    return f"{text}{end}[exit code: {result.exit_code}]"


def _runtime(ctx: ToolContext) -> Runtime:
    if ctx.runtime is None:
        raise RuntimeFailure("the python tool needs a runtime, and this rollout has none")
    return ctx.runtime


async def run_python(
    runtime: Runtime, code: str, timeout_s: float, *, cell: str = "cell.py"
) -> ExecResult:
    """Write `code` to `CELLS_DIR/cell` in `runtime`'s workspace and run it with `python3`
    (final bare expression printed) under `timeout_s`."""
    await runtime.write_file(_RUNNER, _RUNNER_SOURCE)
    path = f"{CELLS_DIR}/{cell}"
    await runtime.write_file(path, code)
    return await runtime.exec(f"exec python3 {_RUNNER} {path}", timeout_s)


def make_python_tool(
    timeout_s: float = DEFAULT_TIMEOUT_S, max_output_chars: int = DEFAULT_OUTPUT_CHARS
) -> Tool:
    """A `python` tool whose runs are killed after `timeout_s` seconds, showing at most
    `max_output_chars` characters of output."""
    if timeout_s <= 0 or max_output_chars <= 0:
        raise ValueError("timeout_s and max_output_chars must be positive")

    @tool(name="python", timeout_s=timeout_s + _TOOL_GRACE_S)
    async def python(code: str, ctx: ToolContext) -> str:
        """Run a Python 3 program in a sandbox (no network) and return its output and exit code.
        Each call is a fresh interpreter: variables do not carry over, files you write do. The
        value of a final bare expression is printed, as in a notebook. sympy, mpmath and numpy
        are available. Long output is truncated.

        Args:
            code: The Python source to run, e.g. `print(sum(range(10)))`.
        """
        if "\0" in code:
            raise ValueError("the code contains a NUL byte")
        count = int(ctx.state.get("python_calls", 0)) + 1
        ctx.state["python_calls"] = count
        result = await run_python(_runtime(ctx), code, timeout_s, cell=f"cell_{count:03d}.py")
        text = format_result(result, max_output_chars)
        if result.timed_out:
            raise CodeTimedOut(
                f"the code ran longer than {timeout_s:g} s and was killed; output so far:\n{text}"
            )
        return text

    return python


python = make_python_tool()
"""The `python` tool with the default time limit and output size."""
