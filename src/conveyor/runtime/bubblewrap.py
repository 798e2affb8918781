"""The bubblewrap runtime: each command in a fresh sandbox confined to the rollout's workspace.

Every `exec` starts its own `bwrap` (a few milliseconds) with new PID, network, IPC and UTS
namespaces: the system folders read-only, the workspace read-write at `/workspace`, the project's
Python environment read-only at its own path, a private `/tmp` (a host folder of this runtime's,
kept across its commands and removed on close), and no network but loopback. Inside, the command
drops to the unprivileged `SANDBOX_UID` (`setpriv`), enters a user namespace of its own
(`unshare`, so the process count below is per sandbox, not per host user), and runs under
`prlimit` with the `SandboxLimits`. When the command ends, times out or is cancelled, the PID
namespace dies with it, so nothing it started survives.

Commands do not share a shell: each starts in `/workspace` with a fresh environment; files in
the workspace and in `/tmp` persist, processes do not.

`bubblewrap_available()` (checked by every `start`) keeps a successful probe for the process; a
failed one only for `PROBE_RETRY_AFTER_S`, so a transient failure (a probe timing out under load)
fails the starts of that moment as infrastructure errors and is probed again after.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conveyor.config import RuntimeConfig
from conveyor.registry import RUNTIMES
from conveyor.runtime.base import ExecResult, RuntimeFailure
from conveyor.runtime.limits import (
    MARKER_ENV,
    SANDBOX_GID,
    SANDBOX_UID,
    SandboxLimits,
    kill_marked,
    prlimit_argv,
    run_limited,
)
from conveyor.runtime.selection import RuntimeRequest
from conveyor.runtime.workspace_files import HostWorkspaceRuntime, WorkspaceFiles

WORKSPACE_PATH = "/workspace"
_TOOLS = ("bwrap", "setpriv", "unshare", "prlimit")
# What of /etc a command may need (users, the loader, alternatives, time zone); the rest of /etc
# stays out of the sandbox.
_ETC_ENTRIES = (
    "passwd",
    "group",
    "hosts",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "mime.types",
    "ssl",
)
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


class BubblewrapRuntime(HostWorkspaceRuntime):
    """A `Runtime` running each command in a bubblewrap sandbox over a host workspace folder.

    Args to the constructor: `workspace`, the host folder mounted read-write at `/workspace`
    (writable by `SANDBOX_UID`: see `make_workspace`); `env_dir`, a venv or site-packages folder
    mounted read-only (a venv's base interpreter is mounted too); `limits`; `extra_ro_binds`,
    more host folders mounted read-only at their own path; `env`, extra environment variables.
    """

    root = WORKSPACE_PATH

    _kind = "bubblewrap runtime"

    def __init__(
        self,
        workspace: Path,
        *,
        env_dir: Path | None = None,
        limits: SandboxLimits | None = None,
        extra_ro_binds: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
    ):
        self.workspace = Path(workspace)
        self.env_dir = Path(env_dir) if env_dir is not None else None
        self.limits = limits if limits is not None else SandboxLimits()
        self.extra_ro_binds = [Path(p) for p in extra_ro_binds]
        self.extra_env = dict(env or {})
        self.sandbox_id = f"bwrap-{uuid.uuid4().hex[:12]}"
        owner = (SANDBOX_UID, SANDBOX_GID)
        self.files = WorkspaceFiles(self.workspace, WORKSPACE_PATH, owner=owner)
        self._tmp: Path | None = None
        self._commands = itertools.count()
        self._started = False
        self._closed = False

    async def start(self) -> None:
        """Check that bubblewrap works here and the folders exist; `RuntimeFailure` otherwise."""
        if self._closed:
            raise RuntimeFailure("bubblewrap runtime is closed and cannot be started again")
        # In a thread: a probe (the first, or one after a failure) may take seconds under load.
        ok, reason = await asyncio.to_thread(bubblewrap_available)
        if not ok:
            raise RuntimeFailure(f"bubblewrap is not usable here: {reason}")
        if not self.workspace.is_dir():
            raise RuntimeFailure(f"workspace {self.workspace} is not a folder")
        for folder in [*([self.env_dir] if self.env_dir else []), *self.extra_ro_binds]:
            if not folder.exists():
                raise RuntimeFailure(f"read-only mount {folder} does not exist")
        if os.geteuid() == 0 and self.workspace.stat().st_uid != SANDBOX_UID:
            raise RuntimeFailure(
                f"workspace {self.workspace} is not owned by the sandbox user (uid {SANDBOX_UID}), "
                "so commands could not write in it: make it with make_workspace() or chown it"
            )
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix=f"conveyor-{self.sandbox_id}-tmp-"))
            os.chown(self._tmp, SANDBOX_UID, SANDBOX_GID)
        self._started = True

    async def exec(
        self, command: str, timeout_s: float, *, pass_fds: Sequence[int] = ()
    ) -> ExecResult:
        """Run `command` with bash in a fresh sandbox; on timeout everything in it is killed.

        `pass_fds`: host file descriptors the command inherits at the same numbers (bubblewrap,
        setpriv, unshare and prlimit keep them open), e.g. the grader's outcome channel.
        """
        self._check_usable()
        # Per-command marker: finishing one command must not kill a concurrent one.
        marker = f"{self.sandbox_id}.{next(self._commands)}"
        return await run_limited(
            self.command_argv(command),
            timeout_s=timeout_s,
            output_bytes=self.limits.output_bytes,
            env=self.environment(marker),
            cleanup=functools.partial(kill_marked, marker),
            pass_fds=pass_fds,
        )

    async def close(self) -> None:
        """Kill anything of this sandbox still running; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self._kill_leftovers()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def environment(self, marker: str | None = None) -> dict[str, str]:
        """The variables a command sees: a clean set, the venv's bin first, plus `env`."""
        env = {
            "PATH": _DEFAULT_PATH,
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "PAGER": "cat",
            "GIT_PAGER": "cat",
        }
        if self.env_dir is not None:
            if (self.env_dir / "pyvenv.cfg").exists():
                env["VIRTUAL_ENV"] = str(self.env_dir)
                env["PATH"] = f"{self.env_dir / 'bin'}:{_DEFAULT_PATH}"
            else:
                env["PYTHONPATH"] = str(self.env_dir)
        env.update(self.extra_env)
        env[MARKER_ENV] = marker or self.sandbox_id
        return env

    def command_argv(self, command: str) -> list[str]:
        """The full `bwrap ... setpriv ... unshare ... prlimit ... bash -c command` argv."""
        argv = [*_bwrap_base(self.limits, self._tmp)]
        argv += ["--bind", str(self.workspace), WORKSPACE_PATH, "--chdir", WORKSPACE_PATH]
        mounts = self._ro_mounts()
        argv += _parent_dirs(mounts)
        for folder in mounts:
            argv += ["--ro-bind", str(folder), str(folder)]
        return [*argv, *_drop_privileges(), *prlimit_argv(self.limits), _shell(), "-c", command]

    def _ro_mounts(self) -> list[Path]:
        mounts = list(self.extra_ro_binds)
        if self.env_dir is not None:
            mounts.append(self.env_dir)
            base = _venv_base_prefix(self.env_dir)
            if base is not None and not base.is_relative_to("/usr"):
                mounts.append(base)
        return mounts

    def _kill_leftovers(self) -> None:
        # Each PID namespace already ends with its command; this catches commands still running.
        kill_marked(self.sandbox_id)


class HidingBubblewrapRuntime(BubblewrapRuntime):
    """A `BubblewrapRuntime` whose sandboxes see an empty folder in place of each `hidden` host
    folder (a tmpfs mounted over it), e.g. a dataset's package that holds the graders' tests."""

    def __init__(self, workspace: Path, *, hidden: Sequence[Path] = (), **kwargs: Any) -> None:
        super().__init__(workspace, **kwargs)
        self.hidden = [Path(path) for path in hidden]

    def command_argv(self, command: str) -> list[str]:
        """The bubblewrap argv with a `--tmpfs` over each hidden folder, after the other mounts."""
        argv = super().command_argv(command)
        masks = [arg for path in self.hidden for arg in ("--tmpfs", str(path))]
        at = argv.index("setpriv")
        return [*argv[:at], *masks, *argv[at:]]


def _available() -> tuple[bool, str]:
    return bubblewrap_available()  # looked up when asked, so a test can stand in for the probe


@RUNTIMES.register("bubblewrap", hides_paths=True, available=_available)
def build_bubblewrap(request: RuntimeRequest, settings: RuntimeConfig) -> BubblewrapRuntime:
    """`runtime.kind: bubblewrap`: a sandbox per command over the request's workspace (with a
    tmpfs over each of its `hidden` host folders)."""
    workspace = request.host_workspace("bubblewrap")
    options: dict[str, Any] = {
        "env_dir": request.env_dir,
        "limits": request.limits,
        "extra_ro_binds": request.read_only,
    }
    runtime = (
        HidingBubblewrapRuntime(workspace, hidden=request.hidden, **options)
        if request.hidden
        else BubblewrapRuntime(workspace, **options)
    )
    runtime.extra_env.update(request.env_at(runtime.root))
    return runtime


# After a failed probe, callers within this many seconds get its answer without probing again
# (a probe under load may itself take up to its 30 s timeout); a success is kept for good.
PROBE_RETRY_AFTER_S = 5.0


class _BubblewrapProbe:
    """`bubblewrap_available()`: a success is remembered for the process, a failure only for
    `PROBE_RETRY_AFTER_S` (it may be transient: a probe timing out under load), so one bad probe
    never decides the rest of a run. `cache_clear()` forgets both; `__wrapped__()` probes
    without the memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ok: tuple[bool, str] | None = None
        self._failed: tuple[float, tuple[bool, str]] | None = None

    def __call__(self) -> tuple[bool, str]:
        """Whether sandboxes can be made here, and why not: the tools exist and a probe runs."""
        with self._lock:
            if self._ok is not None:
                return self._ok
            if self._failed is not None:
                at, answer = self._failed
                if time.monotonic() - at < PROBE_RETRY_AFTER_S:
                    return answer
            answer = probe_bubblewrap()
            if answer[0]:
                self._ok, self._failed = answer, None
            else:
                self._failed = (time.monotonic(), answer)
            return answer

    @staticmethod
    def __wrapped__() -> tuple[bool, str]:
        return probe_bubblewrap()

    def cache_clear(self) -> None:
        """Forget the last answer: the next call probes."""
        with self._lock:
            self._ok = self._failed = None


def probe_bubblewrap() -> tuple[bool, str]:
    """One probe, nothing remembered: the tools are on PATH and a sandbox starts as the sandbox
    user. `(ok, why not)`."""
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        hint = " (apt-get install bubblewrap)" if "bwrap" in missing else ""
        return False, f"missing {', '.join(missing)} on PATH{hint}"
    probe = [*_bwrap_base(SandboxLimits()), *_drop_privileges(), *prlimit_argv(SandboxLimits())]
    probe += [_shell(), "-c", f"test $(id -u) = {SANDBOX_UID}"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"the bwrap probe failed: {exc}"
    if done.returncode != 0:
        detail = done.stderr.strip() or f"exit code {done.returncode}"
        return False, f"the bwrap probe failed: {detail}"
    return True, "bubblewrap works"


bubblewrap_available = _BubblewrapProbe()


def _bwrap_base(limits: SandboxLimits, tmp: Path | None = None) -> list[str]:
    """Namespaces, the read-only system and `/tmp` (`tmp` or a tmpfs); the caller adds the
    workspace."""
    argv = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent"]
    argv += ["--new-session", "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), f"/{name}"]
    etc = [Path("/etc") / name for name in _ETC_ENTRIES if (Path("/etc") / name).exists()]
    etc += sorted(Path("/etc").glob("python3*"))
    argv += _parent_dirs(etc)
    for entry in etc:
        argv += ["--ro-bind", str(entry), str(entry)]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if tmp is not None:
        argv += ["--bind", str(tmp), "/tmp"]
    else:
        argv += ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    return argv


def _parent_dirs(mounts: Sequence[Path]) -> list[str]:
    """`--dir` for every folder above the mount points, world-readable (bwrap's default is 0700,
    which the sandbox user could not traverse)."""
    parents = {parent for mount in mounts for parent in mount.parents if parent != Path("/")}
    argv: list[str] = []
    for parent in sorted(parents, key=lambda p: (len(p.parts), str(p))):
        argv += ["--perms", "0755", "--dir", str(parent)]
    return argv


def _drop_privileges() -> list[str]:
    """Become `SANDBOX_UID` with no capabilities, then enter a user namespace of our own."""
    return [
        "setpriv",
        f"--reuid={SANDBOX_UID}",
        f"--regid={SANDBOX_GID}",
        "--clear-groups",
        "--bounding-set=-all",
        "--inh-caps=-all",
        "--no-new-privs",
        "--",
        "unshare",
        f"--map-user={SANDBOX_UID}",
        f"--map-group={SANDBOX_GID}",
        "--",
    ]


def _shell() -> str:
    return "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"


def _venv_base_prefix(env_dir: Path) -> Path | None:
    """The interpreter prefix a venv points to (its `home` is `<prefix>/bin`), if it is one."""
    config = env_dir / "pyvenv.cfg"
    if not config.exists():
        return None
    for line in config.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(os.path.realpath(value.strip())).parent
    return None
