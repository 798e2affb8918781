"""The local runtime: commands as plain subprocesses in the workspace, with limits but no isolation.

For machines where bubblewrap cannot run. Commands get the same rlimits and are killed as a
process group (plus anything still carrying the runtime's marker variable), but they see the
whole file system and the network, run as the calling user (as root, the process-count limit does
not bind), and can outlive a kill by clearing their environment and leaving the group.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import shutil
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from conveyor.config import RuntimeConfig
from conveyor.registry import RUNTIMES
from conveyor.runtime.base import ExecResult, RuntimeFailure
from conveyor.runtime.limits import (
    MARKER_ENV,
    SandboxLimits,
    kill_marked,
    prlimit_argv,
    run_limited,
)
from conveyor.runtime.selection import RuntimeRequest
from conveyor.runtime.workspace_files import HostWorkspaceRuntime, WorkspaceFiles

log = logging.getLogger(__name__)

NO_ISOLATION_WARNING = (
    "LocalRuntime does not isolate: agent commands run as this user with full file-system and "
    "network access (only rlimits and process-group kills apply). Use BubblewrapRuntime or "
    "DockerRuntime for untrusted commands."
)
_warned = False


class LocalRuntime(HostWorkspaceRuntime):
    """A `Runtime` running `bash -c` in a host workspace folder under `SandboxLimits`.

    The agent sees the workspace at its real host path (`root`). File operations are confined to
    the workspace like the sandboxed runtimes'. Warns once per process that it does not isolate.
    """

    _kind = "local runtime"

    def __init__(
        self,
        workspace: Path,
        *,
        limits: SandboxLimits | None = None,
        env: Mapping[str, str] | None = None,
    ):
        self.workspace = Path(os.path.realpath(workspace))
        self.limits = limits if limits is not None else SandboxLimits()
        self.extra_env = dict(env or {})
        self.sandbox_id = f"local-{uuid.uuid4().hex[:12]}"
        self.files = WorkspaceFiles(self.workspace, str(self.workspace))
        self._commands = itertools.count()
        self._started = False
        self._closed = False

    @property
    def root(self) -> str:
        """The workspace path as commands see it (the host path)."""
        return str(self.workspace)

    async def start(self) -> None:
        """Check the workspace and `prlimit`; warn (once) that nothing is isolated."""
        if self._closed:
            raise RuntimeFailure("local runtime is closed and cannot be started again")
        if not self.workspace.is_dir():
            raise RuntimeFailure(f"workspace {self.workspace} is not a folder")
        if shutil.which("prlimit") is None:
            raise RuntimeFailure("prlimit (util-linux) is not on PATH; it applies the limits")
        _warn_once()
        self._started = True

    async def exec(
        self, command: str, timeout_s: float, *, pass_fds: Sequence[int] = ()
    ) -> ExecResult:
        """Run `command` with bash in the workspace; its process group dies when it ends.

        `pass_fds`: file descriptors the command inherits at the same numbers (the grader's
        outcome channel), as `BubblewrapRuntime.exec` takes them."""
        self._check_usable()
        env = {**os.environ, "PAGER": "cat", "GIT_PAGER": "cat", **self.extra_env}
        # Per-command marker: finishing one command must not kill a concurrent one.
        marker = f"{self.sandbox_id}.{next(self._commands)}"
        env[MARKER_ENV] = marker
        shell = "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"
        return await run_limited(
            [*prlimit_argv(self.limits), shell, "-c", command],
            timeout_s=timeout_s,
            output_bytes=self.limits.output_bytes,
            cwd=self.workspace,
            env=env,
            cleanup=functools.partial(kill_marked, marker),
            pass_fds=pass_fds,
        )

    async def close(self) -> None:
        """Kill leftovers of this runtime's commands; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self._kill_leftovers()

    def _kill_leftovers(self) -> None:
        kill_marked(self.sandbox_id)


@RUNTIMES.register("local", unsandboxed=True)
def build_local(request: RuntimeRequest, settings: RuntimeConfig) -> LocalRuntime:
    """`runtime.kind: local`: plain subprocesses in the request's workspace (no isolation;
    the read-only folders are simply there, at their host paths)."""
    runtime = LocalRuntime(request.host_workspace("local"), limits=request.limits)
    runtime.extra_env.update(request.env_at(runtime.root))
    return runtime


def _warn_once() -> None:
    global _warned
    if _warned:
        return
    _warned = True
    log.warning(NO_ISOLATION_WARNING)
    warnings.warn(NO_ISOLATION_WARNING, RuntimeWarning, stacklevel=3)
