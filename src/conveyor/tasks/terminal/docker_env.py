"""Running a Harbor task in docker, for folders bubblewrap cannot host (a `RUN`, another base).

`DockerTaskRuntime` builds the task's `environment/` into an image (`docker build`, tagged by a
hash of the folder, so a rebuild is a cache hit) and runs one container of it per rollout with
`conveyor.runtime.docker.DockerRuntime` (no network, no capabilities, limits). `verify` grades
after the rollout: every process the agent left in the container is killed (`kill -9 -1`: only
the container's PID 1 survives), `/tests` and `/logs` (tmpfs mounts, empty from the start: no
capability is needed to write them, and the agent cannot remove them) are emptied, `tests/` is
streamed in as a tar through `exec` (`docker cp` cannot write into a tmpfs), `bash
/tests/test.sh` runs under the verifier timeout, and the reward file is read
(a verifier killed by a signal scores 0, as in bubblewrap; the workspace-link guard is
bubblewrap's only, since the container's files are not on this host).
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
from pathlib import Path, PurePosixPath

from conveyor.runtime.base import ExecResult, RuntimeFailure
from conveyor.runtime.docker import DockerRuntime
from conveyor.runtime.engine import Engine
from conveyor.runtime.limits import SandboxLimits
from conveyor.tasks.terminal.harbor import HarborTask
from conveyor.tasks.terminal.sandbox import KILLED, VerifierResult, reward_from

_BUILD_TIMEOUT_S = 1800.0
_NO_REWARD = "__no_reward_file__"


def image_tag(task: HarborTask) -> str:
    """`conveyor-terminal-<name>:<hash of environment/>`."""
    digest = hashlib.sha256()
    context = task.path / "environment"
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(context)).encode() + b"\0" + path.read_bytes())
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in task.name.lower())
    return f"conveyor-terminal-{name}:{digest.hexdigest()[:16]}"


def dockerfile_workdir(task: HarborTask) -> str:
    """The last `WORKDIR` of the task's Dockerfile (`/` when it sets none)."""
    workdir = "/"
    dockerfile = task.path / "environment" / "Dockerfile"
    for line in dockerfile.read_text().splitlines() if dockerfile.is_file() else []:
        words = line.strip().split(None, 1)
        if len(words) == 2 and words[0].upper() == "WORKDIR":
            workdir = str(PurePosixPath(workdir, words[1].strip()))
    return workdir


class DockerTaskRuntime(DockerRuntime):
    """A container of the task's image; `start` builds the image first (see the module doc)."""

    def __init__(
        self, task: HarborTask, *, limits: SandboxLimits | None, docker: str | Engine
    ) -> None:
        super().__init__(
            image_tag(task),
            limits=limits,
            workdir=dockerfile_workdir(task),
            docker=docker,
            tmpfs=("/tests", "/logs"),
        )
        self.task = task

    async def start(self) -> None:
        """Build the image (a cache hit after the first time), then start the container."""
        context = self.task.path / "environment"
        built = await self._client(
            [self.docker, "build", "-q", "-t", self.image, str(context)],
            timeout_s=_BUILD_TIMEOUT_S,
        )
        if built.exit_code != 0:
            raise RuntimeFailure(
                f"{self.engine.name} build of {self.task.name} failed: "
                f"{built.stderr.strip()[-2000:]}"
            )
        await super().start()

    async def verify(self) -> VerifierResult:
        """Grade the container's state with the task's tests (see the module doc)."""
        await self.exec("kill -9 -1 2>/dev/null; true", 30)
        prepared = await self.exec(
            "chmod 0755 /tests /logs && find /tests /logs -mindepth 1 -delete && "
            "mkdir -p /logs/verifier",
            60,
        )
        if prepared.exit_code != 0:
            return VerifierResult(0.0, "bad_reward_file", prepared.exit_code, prepared.stderr)
        untar = ["tar", "-x", "--no-same-owner", "-C", "/tests"]
        copied = await self._client(
            [self.docker, "exec", "-i", self.name, *untar],
            timeout_s=300,
            stdin=_tarball(self.task.tests_dir),
        )
        if copied.exit_code != 0:
            raise RuntimeFailure(
                f"copying the tests into {self.name} failed: {copied.stderr.strip()}"
            )
        result = await self.exec("bash /tests/test.sh", self.task.verifier_timeout_s)
        output = (result.stdout + result.stderr)[-4000:]
        if result.timed_out:
            return VerifierResult(0.0, "timeout", result.exit_code, output)
        if result.exit_code >= KILLED or result.exit_code < 0:
            return VerifierResult(0.0, "killed", result.exit_code, output)
        return _reward(await self.exec(_read_reward(), 30), result.exit_code, output)


def _tarball(folder: Path) -> bytes:
    """`folder`'s contents as an uncompressed tar stream (what `tar -x` in the container reads)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for child in sorted(folder.iterdir()):
            tar.add(child, arcname=child.name)
    return buffer.getvalue()


def _read_reward() -> str:
    path = shlex.quote("/logs/verifier/reward.txt")
    return f"if [ -L {path} ]; then exit 3; fi; if [ -f {path} ]; then cat {path}; " + (
        f"else echo {_NO_REWARD}; fi"
    )


def _reward(read: ExecResult, exit_code: int, output: str) -> VerifierResult:
    if read.exit_code != 0:
        return VerifierResult(0.0, "bad_reward_file", exit_code, output)
    text = read.stdout
    return reward_from(None if text.strip() == _NO_REWARD else text, exit_code, output)
