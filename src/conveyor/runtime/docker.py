"""The docker runtime: one container per rollout, driven through the `docker` CLI.

For users with a docker engine and images such as SWE-bench's (the repository at `/testbed`
inside the image). `container_spec` builds the `docker run` argv: no network, memory = swap
limit, CPU share, pids limit, rlimits, no capabilities, no new privileges, an optional host
workspace bind-mounted at the working folder. Commands run with `docker exec` under GNU
`timeout` (which kills the command's whole process group inside the container); file operations
run small shell scripts in the container that resolve the path with `realpath` and refuse any
path outside the working folder.
"""

from __future__ import annotations

import functools
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from conveyor.config import RuntimeConfig
from conveyor.registry import RUNTIMES
from conveyor.runtime.base import ExecResult, RuntimeFailure
from conveyor.runtime.limits import SandboxLimits, run_limited
from conveyor.runtime.selection import RuntimeRequest

_OUTSIDE, _MISSING, _IS_DIR, _NOT_DIR = 77, 66, 65, 64
# $1: path, $2: root. Prints the resolved path or exits with one of the codes above.
_RESOLVE = (
    'p=$(cd "$2" && realpath -m -- "$1") || exit 66; '
    'case "$p" in "$2"|"$2"/*) ;; *) exit 77;; esac; '
)
_READ = _RESOLVE + '[ -d "$p" ] && exit 65; [ -e "$p" ] || exit 66; cat -- "$p"'
_WRITE = (
    _RESOLVE + '[ -d "$p" ] && exit 65; d=$(dirname -- "$p"); mkdir -p -- "$d" || exit 64; '
    't=$(mktemp "$d/.edit.XXXXXX") && cat > "$t" && '
    '{ [ ! -e "$p" ] || chmod --reference="$p" "$t"; } && mv -f -- "$t" "$p"'
)
_LIST = _RESOLVE + '[ -e "$p" ] || exit 66; [ -d "$p" ] || exit 64; ls -1Ap -- "$p"'
_CLIENT_GRACE_S = 10.0


def container_spec(
    image: str,
    *,
    name: str,
    limits: SandboxLimits,
    workdir: str = "/testbed",
    workspace: Path | None = None,
    env_dir: Path | None = None,
    extra_ro_binds: Sequence[Path] = (),
    user: str | None = None,
    cpus: float = 1.0,
    env: Mapping[str, str] | None = None,
    docker: str = "docker",
) -> list[str]:
    """The `docker run -d ...` argv of a rollout's container (it idles until `docker rm -f`).

    `workspace`, if given, is mounted read-write at `workdir` (else the image's own copy is
    used); `env_dir` and `extra_ro_binds` are mounted read-only at their own paths. `user` is
    `uid[:gid]` or a name known to the image; `None` keeps the image's user.
    """
    argv = [docker, "run", "-d", "--name", name, "--label", "conveyor.sandbox=1"]
    argv += ["--network", "none", "--workdir", workdir, "--init"]
    argv += ["--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes)]
    argv += ["--cpus", f"{cpus:g}", "--pids-limit", str(limits.max_processes)]
    argv += ["--ulimit", f"cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}"]
    argv += ["--ulimit", f"fsize={limits.file_size_bytes}:{limits.file_size_bytes}"]
    argv += ["--ulimit", f"nofile={limits.open_files}:{limits.open_files}"]
    argv += ["--ulimit", "core=0:0"]
    argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    argv += ["--tmpfs", f"/tmp:rw,size={limits.tmp_bytes}"]
    if user is not None:
        argv += ["--user", user]
    if workspace is not None:
        argv += ["--mount", f"type=bind,source={Path(workspace).resolve()},target={workdir}"]
    for folder in [*([env_dir] if env_dir is not None else []), *extra_ro_binds]:
        source = Path(folder).resolve()
        argv += ["--mount", f"type=bind,source={source},target={source},readonly"]
    for key, value in sorted((env or {}).items()):
        argv += ["--env", f"{key}={value}"]
    return [*argv, image, "sleep", "infinity"]


@functools.cache
def docker_available(docker: str = "docker") -> tuple[bool, str]:
    """Whether a docker engine answers (`docker info`), and why not."""
    try:
        done = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except FileNotFoundError:
        return False, f"no `{docker}` client on PATH"
    except subprocess.TimeoutExpired:
        return False, "`docker info` did not answer within 20 s"
    if done.returncode != 0:
        reason = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return False, f"`docker info` failed: {reason[-1] if reason else done.returncode}"
    return True, f"docker engine {done.stdout.strip()}"


class DockerRuntime:
    """A `Runtime` in a docker container made from `image`; see `container_spec` for the knobs."""

    def __init__(
        self,
        image: str,
        *,
        limits: SandboxLimits | None = None,
        workdir: str = "/testbed",
        workspace: Path | None = None,
        env_dir: Path | None = None,
        extra_ro_binds: Sequence[Path] = (),
        user: str | None = None,
        cpus: float = 1.0,
        env: Mapping[str, str] | None = None,
        docker: str = "docker",
    ):
        self.image = image
        self.limits = limits if limits is not None else SandboxLimits()
        self.root = workdir
        self.docker = docker
        self.name = f"conveyor-{uuid.uuid4().hex[:12]}"
        self.spec = container_spec(
            image,
            name=self.name,
            limits=self.limits,
            workdir=workdir,
            workspace=workspace,
            env_dir=env_dir,
            extra_ro_binds=extra_ro_binds,
            user=user,
            cpus=cpus,
            env=env,
            docker=docker,
        )
        self._started = False
        self._closed = False

    async def start(self) -> None:
        """Check the engine and start the container; `RuntimeFailure` with docker's reason."""
        if self._closed:
            raise RuntimeFailure("docker runtime is closed and cannot be started again")
        ok, reason = docker_available(self.docker)
        if not ok:
            raise RuntimeFailure(f"docker is not usable here: {reason}")
        done = await run_limited(self.spec, timeout_s=300, output_bytes=65536)
        if done.exit_code != 0:
            await self._remove()
            raise RuntimeFailure(f"docker run {self.image} failed: {done.stderr.strip()}")
        self._started = True

    async def exec(self, command: str, timeout_s: float) -> ExecResult:
        """Run `command` with bash in the container; GNU `timeout` kills it at `timeout_s`."""
        self._check_usable()
        inner = ["timeout", "-s", "KILL", f"{timeout_s:g}", "bash", "-c", command]
        started = time.monotonic()
        result = await run_limited(
            [self.docker, "exec", self.name, *inner],
            timeout_s=timeout_s + _CLIENT_GRACE_S,
            output_bytes=self.limits.output_bytes,
        )
        killed_at_limit = result.exit_code == 128 + 9 and time.monotonic() - started >= timeout_s
        if result.timed_out or killed_at_limit:
            # `timeout -s KILL` reports 137; say it the way every runtime does.
            return ExecResult(
                exit_code=124, stdout=result.stdout, stderr=result.stderr, timed_out=True
            )
        return result

    async def read_file(self, path: str) -> str:
        """Read a file inside the working folder."""
        return (await self._script(_READ, path)).stdout

    async def write_file(self, path: str, content: str) -> None:
        """Atomically replace or create a file inside the working folder."""
        await self._script(_WRITE, path, stdin=content.encode())

    async def list_dir(self, path: str) -> list[str]:
        """Entries of a folder inside the working folder, folders with a trailing '/'."""
        listing = (await self._script(_LIST, path)).stdout
        return sorted(line for line in listing.splitlines() if line)

    def alive(self) -> bool:
        """Started and not yet closed."""
        return self._started and not self._closed

    async def close(self) -> None:
        """Remove the container (`docker rm -f`); later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            await self._remove()

    async def _remove(self) -> None:
        await run_limited([self.docker, "rm", "-f", self.name], timeout_s=60, output_bytes=65536)

    async def _script(self, script: str, path: str, stdin: bytes | None = None) -> ExecResult:
        self._check_usable()
        argv = [self.docker, "exec", *(["-i"] if stdin is not None else []), self.name]
        argv += ["sh", "-c", script, "sh", path, self.root]
        result = await run_limited(argv, timeout_s=60, output_bytes=1 << 30, stdin=stdin)
        code = result.exit_code
        if code == _OUTSIDE:
            raise PermissionError(f"path {path!r} resolves outside the workspace {self.root}")
        if code == _MISSING:
            raise FileNotFoundError(f"{path}: no such file or directory")
        if code == _IS_DIR:
            raise IsADirectoryError(f"{path}: is a directory")
        if code == _NOT_DIR:
            raise NotADirectoryError(f"{path}: not a directory")
        if code != 0:
            raise RuntimeFailure(f"docker exec in {self.name} failed: {result.stderr.strip()}")
        return result

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeFailure("docker runtime is closed")
        if not self._started:
            raise RuntimeFailure("docker runtime was never started")


DOCKER_WORKDIR = "/workspace"


@RUNTIMES.register("docker", needs_image=True)
def build_docker(request: RuntimeRequest, settings: RuntimeConfig) -> DockerRuntime:
    """`runtime.kind: docker`: a container of `runtime.docker_image` with the request's
    workspace mounted at /workspace, its commands run as the workspace's owner (the container
    has no capabilities, so another user could not write it)."""
    if not settings.docker_image:
        raise ValueError("runtime.kind 'docker' needs runtime.docker_image (the image to run)")
    workspace = request.host_workspace("docker")
    owner = workspace.stat()
    return DockerRuntime(
        settings.docker_image,
        limits=request.limits,
        workdir=DOCKER_WORKDIR,
        workspace=workspace,
        env_dir=request.env_dir,
        extra_ro_binds=request.read_only,
        user=f"{owner.st_uid}:{owner.st_gid}",
        env=request.env_at(DOCKER_WORKDIR),
    )
