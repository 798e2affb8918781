"""The docker runtime: one container per rollout, on podman or docker through their CLI.

For users with an OCI engine and images such as SWE-bench's (the repository at `/testbed`
inside the image). `runtime.engine` picks the engine (`conveyor.runtime.engine`: podman where it
answers, else docker; both clients take the same arguments). `container_spec` builds the
`run` argv: no network, memory = swap limit, CPU share, pids limit, rlimits, no capabilities,
no new privileges, an optional host workspace bind-mounted at the working folder, and labels
naming this host and process, so that the next start sweeps what a killed run left behind.
Commands run with `exec` under GNU `timeout` (which kills the command's whole process group
inside the container) and carry a marker variable, so that on a timeout whatever left the group
(`setsid`, double forks) is found in the container's `/proc` and killed too. File operations run
small shell scripts in the container that resolve the path with `realpath` and refuse any path
outside the working folder. `close` removes the container with its anonymous volumes.
"""

from __future__ import annotations

import asyncio
import resource
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from conveyor.config import RuntimeConfig
from conveyor.registry import RUNTIMES
from conveyor.runtime.base import ExecResult, RuntimeFailure
from conveyor.runtime.engine import (
    SANDBOX_LABEL,
    Engine,
    engine_available,
    engine_of,
    owner_labels,
    resolve_engine,
    sweep_once,
)
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
_EXEC_MARKER = "CONVEYOR_EXEC"
# One command: $1 the time limit, $2 its marker variable, $3 the command. GNU `timeout` kills
# the command's process group at the limit; then every process carrying the marker (what left
# the group: `setsid`, double forks, a background fork bomb) is killed, in rounds until none is
# left, with bash builtins only (no fork: a bomb may hold every pid the limit allows).
_RUN = (
    'timeout -s KILL "$1" env "$2" bash -c "$3"; rc=$?; i=0\n'
    "while [ $i -lt 50 ]; do i=$((i + 1)); found=0\n"
    "  for d in /proc/[0-9]*; do\n"
    "    while IFS= read -r -d '' v; do\n"
    '      if [ "$v" = "$2" ]; then kill -9 "${d#/proc/}"; found=1; break; fi\n'
    '    done 2>/dev/null < "$d/environ"\n'
    "  done\n"
    '  [ "$found" = 0 ] && break\n'
    "done\n"
    'exit "$rc"\n'
)


# The container's main process, its PID 1: it idles, restarts its sleep when a command kills
# it (`kill -9 -1`, as the terminal verifier does: PID 1 itself cannot be killed from inside),
# and its `wait` reaps the orphans every command leaves (their zombies would hold pids).
KEEPER = "while :; do sleep 86400 & wait; done"


def host_nproc() -> int:
    """The most processes a container may ask for here: this process's hard RLIMIT_NPROC, at
    most the kernel's pid_max."""
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    return pid_max if hard == resource.RLIM_INFINITY else min(hard, pid_max)


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
    labels: Mapping[str, str] | None = None,
    tmpfs: Sequence[str] = (),
    ro_binds: Mapping[Path, str] | None = None,
) -> list[str]:
    """The `docker run -d ...` argv of a rollout's container (`KEEPER` idles until `rm -f`).

    `workspace`, if given, is mounted read-write at `workdir` (else the image's own copy is
    used); `env_dir` and `extra_ro_binds` are mounted read-only at their own paths. `user` is
    `uid[:gid]` or a name known to the image; `None` keeps the image's user. `labels` are added
    to `conveyor.sandbox=1`; `tmpfs` are more folders that start empty, like `/tmp`, each of
    `limits.tmp_bytes` (programs may run from them: `exec`, which engines leave out by default).
    `ro_binds` maps more host folders to where they show, read-only, inside the container (a
    path of the container's own: a host path under a 0700 home would be unreachable there).
    """
    argv = [docker, "run", "-d", "--name", name, "--label", f"{SANDBOX_LABEL}=1"]
    for key, value in sorted((labels or {}).items()):
        if key != SANDBOX_LABEL:
            argv += ["--label", f"{key}={value}"]
    # --stop-timeout 0: `rm -f` kills at once (the keeper, PID 1, ignores SIGTERM).
    argv += ["--network", "none", "--workdir", workdir, "--stop-timeout", "0"]
    argv += ["--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes)]
    argv += ["--cpus", f"{cpus:g}", "--pids-limit", str(limits.max_processes)]
    argv += ["--ulimit", f"cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}"]
    argv += ["--ulimit", f"fsize={limits.file_size_bytes}:{limits.file_size_bytes}"]
    argv += ["--ulimit", f"nofile={limits.open_files}:{limits.open_files}"]
    argv += ["--ulimit", "core=0:0"]
    # Not a sandbox limit (the pids cgroup is): podman sets RLIMIT_NPROC to 1048576 whenever
    # any --ulimit is given, which a root without CAP_SYS_RESOURCE cannot (runc: "error setting
    # rlimit type 6"); so ask for what this host allows.
    nproc = host_nproc()
    argv += ["--ulimit", f"nproc={nproc}:{nproc}"]
    argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    for empty in ["/tmp", *tmpfs]:
        argv += ["--tmpfs", f"{empty}:rw,exec,size={limits.tmp_bytes}"]
    if user is not None:
        argv += ["--user", user]
    if workspace is not None:
        argv += ["--mount", f"type=bind,source={Path(workspace).resolve()},target={workdir}"]
    for folder in [*([env_dir] if env_dir is not None else []), *extra_ro_binds]:
        source = Path(folder).resolve()
        argv += ["--mount", f"type=bind,source={source},target={source},readonly"]
    for host, target in sorted((ro_binds or {}).items()):
        argv += ["--mount", f"type=bind,source={Path(host).resolve()},target={target},readonly"]
    for key, value in sorted((env or {}).items()):
        argv += ["--env", f"{key}={value}"]
    return [*argv, image, "sh", "-c", KEEPER]


def docker_available(docker: str = "docker") -> tuple[bool, str]:
    """Whether the engine behind the client `docker` answers (`info`), and why not."""
    return engine_available(engine_of(docker))


class DockerRuntime:
    """A `Runtime` in a container made from `image` on the engine `docker` (a client name or
    path, or an `Engine`); see `container_spec` for the knobs."""

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
        docker: str | Engine = "docker",
        tmpfs: Sequence[str] = (),
        ro_binds: Mapping[Path, str] | None = None,
    ):
        self.image = image
        self.limits = limits if limits is not None else SandboxLimits()
        self.root = workdir
        self.engine = docker if isinstance(docker, Engine) else engine_of(docker)
        self.docker = self.engine.client
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
            docker=self.docker,
            labels=owner_labels(),
            tmpfs=tmpfs,
            ro_binds=ro_binds,
        )
        self._started = False
        self._closed = False
        self._execs = 0

    async def start(self) -> None:
        """Check the engine, sweep what killed runs left (once per process), start the
        container; `RuntimeFailure` with the engine's reason."""
        if self._closed:
            raise RuntimeFailure("docker runtime is closed and cannot be started again")
        ok, reason = engine_available(self.engine)
        if not ok:
            raise RuntimeFailure(f"{self.engine.name} is not usable here: {reason}")
        await asyncio.to_thread(sweep_once, self.engine)
        done = await self._client(self.spec, timeout_s=300)
        if done.exit_code != 0:
            await self._remove()
            raise RuntimeFailure(
                f"{self.engine.name} run {self.image} failed: {done.stderr.strip()}"
            )
        self._started = True

    async def exec(self, command: str, timeout_s: float) -> ExecResult:
        """Run `command` with bash in the container; GNU `timeout` kills it at `timeout_s`, and
        what it left running (in its group or not) is killed when it ends (`_RUN`)."""
        self._check_usable()
        self._execs += 1
        marker = f"{_EXEC_MARKER}={self.name}.{self._execs}"
        inner = ["bash", "-c", _RUN, "bash", f"{timeout_s:g}", marker, command]
        started = time.monotonic()
        result = await self._client(
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
        await self._client([self.docker, "rm", "-f", "-v", self.name], timeout_s=60)

    async def _client(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        output_bytes: int = 65536,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run the engine's client (with its environment: podman's containers.conf)."""
        return await run_limited(
            argv,
            timeout_s=timeout_s,
            output_bytes=output_bytes,
            cwd=self.engine.cwd,
            env=self.engine.env,
            stdin=stdin,
        )

    async def _script(self, script: str, path: str, stdin: bytes | None = None) -> ExecResult:
        self._check_usable()
        argv = [self.docker, "exec", *(["-i"] if stdin is not None else []), self.name]
        argv += ["sh", "-c", script, "sh", path, self.root]
        result = await self._client(argv, timeout_s=60, output_bytes=1 << 30, stdin=stdin)
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
            raise RuntimeFailure(
                f"{self.engine.name} exec in {self.name} failed: {result.stderr.strip()}"
            )
        return result

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeFailure("docker runtime is closed")
        if not self._started:
            raise RuntimeFailure("docker runtime was never started")


DOCKER_WORKDIR = "/workspace"
CONTAINER_WORKDIR = "/testbed"
# The image's own world-writable folders besides /tmp: tmpfs mounts of `limits.tmp_bytes`, so
# that a command (no capabilities, not root) can fill no disk but its workspace's (the
# engine's overlay cannot be size-limited on ext4: `--storage-opt size` needs XFS).
WRITABLE_DIRS = ("/var/tmp", "/run/lock")


@RUNTIMES.register("docker", needs_image=True)
def build_docker(request: RuntimeRequest, settings: RuntimeConfig) -> DockerRuntime:
    """`runtime.kind: docker`: a container of `runtime.docker_image` on `runtime.engine` with
    the request's workspace mounted at /workspace, its commands run as the workspace's owner
    (the container has no capabilities, so another user could not write it)."""
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
        docker=resolve_engine(settings.engine),
    )


@RUNTIMES.register("container")
def build_container(request: RuntimeRequest, settings: RuntimeConfig) -> DockerRuntime:
    """`runtime.kind: container`: a container of the task's own image (`request.image`, which
    the family names: its per-task image, or `runtime.image` filled with the row's fields),
    else `runtime.docker_image`, on `runtime.engine`, the request's workspace mounted at
    /testbed (SWE-bench's layout), commands run as the workspace's owner. Nothing of the
    host is mounted but the workspace and the request's read-only folders."""
    image = request.image or settings.docker_image
    if not image:
        raise ValueError(
            "runtime.kind 'container' needs the task's image: a task family that names one "
            "(swe), or runtime.docker_image"
        )
    workspace = request.host_workspace("container")
    owner = workspace.stat()
    return DockerRuntime(
        image,
        limits=request.limits,
        workdir=CONTAINER_WORKDIR,
        workspace=workspace,
        env_dir=request.env_dir,
        extra_ro_binds=request.read_only,
        user=f"{owner.st_uid}:{owner.st_gid}",
        env=request.env_at(CONTAINER_WORKDIR),
        docker=resolve_engine(settings.engine),
        tmpfs=WRITABLE_DIRS,
    )
