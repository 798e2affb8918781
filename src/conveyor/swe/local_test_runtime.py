"""The local runtime for grading where bubblewrap cannot run: `LocalRuntime` plus inherited fds.

The grader hands its outcome channel to the test command as a file descriptor; `LocalRuntime`
(shared with every other use) has no way to pass one, so grading uses this subclass. It isolates
nothing (the parent warns once): only for trusted commands, as `LocalRuntime` itself.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

from conveyor.runtime.base import ExecResult
from conveyor.runtime.limits import MARKER_ENV, kill_marked, prlimit_argv, run_limited
from conveyor.runtime.local import LocalRuntime


class LocalTestRuntime(LocalRuntime):
    """`LocalRuntime` whose `exec` can pass file descriptors to the command."""

    async def exec(
        self, command: str, timeout_s: float, *, pass_fds: Sequence[int] = ()
    ) -> ExecResult:
        """Run `command` with bash in the workspace, `pass_fds` open in it."""
        if not pass_fds:
            return await super().exec(command, timeout_s)
        self._check_usable()
        marker = f"{self.sandbox_id}.fds.{os.getpid()}.{id(pass_fds)}"
        env = {**os.environ, "PAGER": "cat", **self.extra_env, MARKER_ENV: marker}
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
