"""Running a Harbor task in bubblewrap: the workspace at the Dockerfile's WORKDIR, and the verifier.

The rollout's runtime (`TerminalSandbox`) is the bubblewrap runtime with the workspace mounted at
`WORKDIR` (`/app` for most tasks) instead of `/workspace`. Nothing of the task's `tests/` or
`solution/` is visible to it, and `/logs` does not exist for it (the sandbox's root is not
writable), so nothing the agent does can put a reward where the verifier writes one.

`run_verifier` grades after the rollout, in a new sandbox over the same workspace: a fresh
private `/tmp` (so nothing planted there, e.g. a `usercustomize` under `$HOME`, carries over),
the task's `tests/` copied from the task folder to a new host folder mounted read-only at
`/tests`, and a new empty host folder at `/logs`; then `bash /tests/test.sh` under the verifier
timeout. The reward is `/logs/verifier/reward.txt` (one number in [0, 1]) or, where the script
wrote none, its exit status (0 is a pass). A timeout scores 0, and so does a verifier killed by a
signal (code under test could write a reward, then kill its judge) and a workspace holding a
symbolic link into `/tests`, `/logs` or `/proc` (an output file that is really the answer key).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from conveyor.runtime.base import RuntimeFailure
from conveyor.runtime.bubblewrap import WORKSPACE_PATH, BubblewrapRuntime
from conveyor.runtime.limits import SANDBOX_GID, SANDBOX_UID, SandboxLimits
from conveyor.runtime.selection import started
from conveyor.runtime.workspace_files import WorkspaceFiles
from conveyor.tasks.terminal.harbor import EnvironmentPlan, HarborTask

REWARD_FILE = "verifier/reward.txt"
REWARD_JSON = "verifier/reward.json"
# Where a workspace link must not point when the verifier reads the workspace.
_GUARDED = ("/tests", "/logs", "/proc", "/dev/fd", "/dev/stdin")
# An exit code from this up is a death by a signal (128 + its number).
KILLED = 128
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# Read-only mount of a folder holding `python` -> python3 (the python images have both names).
_SHIMS_AT = "/opt/conveyor-terminal/bin"


def cache_root() -> Path:
    """Where templates, workspaces and verifier folders go (`$CONVEYOR_TERMINAL_HOME`, or a
    folder under the system's temporary folder)."""
    configured = os.environ.get("CONVEYOR_TERMINAL_HOME")
    root = Path(configured) if configured else Path(tempfile.gettempdir()) / "conveyor-terminal"
    root.mkdir(parents=True, exist_ok=True)
    return root


@dataclass(frozen=True)
class Mount:
    """A host folder shown at `target` inside the sandbox."""

    source: Path
    target: str
    writable: bool = False


class TerminalSandbox(BubblewrapRuntime):
    """The bubblewrap runtime with the workspace at `workdir` and more mounts (`mounts`)."""

    _kind = "terminal sandbox"

    def __init__(
        self,
        workspace: Path,
        workdir: str,
        *,
        limits: SandboxLimits | None = None,
        env: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
    ) -> None:
        shims = shims_dir()
        super().__init__(workspace, limits=limits, env=env, extra_ro_binds=[shims])
        self.root = workdir
        self.mounts = list(mounts)
        owner = (SANDBOX_UID, SANDBOX_GID)
        self.files = WorkspaceFiles(self.workspace, workdir, owner=owner)
        self.extra_env.setdefault("PATH", f"{_SYSTEM_PATH}:{shims}")

    def command_argv(self, command: str) -> list[str]:
        """The bubblewrap argv with the workspace moved to `workdir` and the mounts added."""
        argv = super().command_argv(command)
        at = argv.index(str(self.workspace))
        if argv[at - 1 : at + 3] != ["--bind", str(self.workspace), WORKSPACE_PATH, "--chdir"]:
            raise RuntimeFailure("unexpected bubblewrap argv: cannot move the workspace")
        argv[at + 1] = self.root
        argv[at + 3] = self.root
        extra = _parents([self.root, *(m.target for m in self.mounts)])
        for mount in self.mounts:
            extra += ["--bind" if mount.writable else "--ro-bind", str(mount.source), mount.target]
        # bwrap options end where the unprivileged command (setpriv ...) begins.
        cut = argv.index("setpriv")
        return [*argv[: at - 1], *extra, *argv[at - 1 : cut], *argv[cut:]]


def _parents(targets: Sequence[str]) -> list[str]:
    parents = {str(p) for t in targets for p in PurePosixPath(t).parents if str(p) != "/"}
    argv: list[str] = []
    for parent in sorted(parents, key=lambda p: (p.count("/"), p)):
        argv += ["--perms", "0755", "--dir", parent]
    return argv


def shims_dir() -> Path:
    """A host folder with `python` -> `/usr/bin/python3`, made once."""
    folder = cache_root() / "shims"
    link = folder / "python"
    if not link.is_symlink():
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".python.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to("/usr/bin/python3")
        temporary.replace(link)
    return folder


def template_for(task: HarborTask) -> Path:
    """The task's starting workspace (its Dockerfile's COPYs under WORKDIR), built once per
    content: a later edit of the environment folder gives a new template."""
    plan = task.environment
    context = task.path / "environment"
    key = hashlib.sha256(repr(plan).encode())
    for source, _ in plan.copies:
        for path in _files_under(context / source):
            key.update(str(path.relative_to(context)).encode() + b"\0" + path.read_bytes())
    templates = cache_root() / "templates"
    folder = templates / f"{task.name}-{key.hexdigest()[:16]}"
    if folder.is_dir():
        return folder
    templates.mkdir(exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{task.name}-", dir=templates))
    _copy_into(building, plan, context)
    try:
        building.rename(folder)
    except OSError:  # another process built it first
        shutil.rmtree(building, ignore_errors=True)
    return folder


def _files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def _copy_into(folder: Path, plan: EnvironmentPlan, context: Path) -> None:
    folder.chmod(0o755)
    for source, dest in plan.copies:
        relative = PurePosixPath(dest).relative_to(plan.workdir)
        target = folder / relative
        origin = context / source
        if origin.is_dir():
            shutil.copytree(origin, target, dirs_exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)


@dataclass(frozen=True)
class VerifierResult:
    """What the verifier said: the reward, where it came from (`reward_file`, `exit_status`,
    `timeout`, `bad_reward_file`), its exit code and the tail of its output."""

    reward: float
    source: str
    exit_code: int
    output: str


async def run_verifier(
    task: HarborTask, workspace: Path, limits: SandboxLimits | None = None
) -> VerifierResult:
    """Grade `workspace` with the task's tests in a fresh sandbox (see the module doc)."""
    link = link_into_verifier(workspace, task.environment.workdir)
    if link is not None:
        return VerifierResult(0.0, "link_into_verifier", -1, link)
    scratch = Path(tempfile.mkdtemp(prefix="verify-", dir=cache_root()))
    try:
        tests, logs = scratch / "tests", scratch / "logs"
        shutil.copytree(task.tests_dir, tests, symlinks=False)
        _readable(tests)
        (logs / "verifier").mkdir(parents=True)
        _give_to_sandbox(logs)
        env = {**task.environment.env, **task.verifier_env}
        mounts = [Mount(tests, "/tests"), Mount(logs, "/logs", writable=True)]
        sandbox = TerminalSandbox(
            workspace, task.environment.workdir, limits=limits, env=env, mounts=mounts
        )
        await started(sandbox)
        try:
            result = await sandbox.exec("bash /tests/test.sh", task.verifier_timeout_s)
        finally:
            await sandbox.close()
        output = (result.stdout + result.stderr)[-4000:]
        if result.timed_out:
            return VerifierResult(0.0, "timeout", result.exit_code, output)
        if result.exit_code >= KILLED or result.exit_code < 0:
            # Killed by a signal (code it ran may kill it after writing a reward): no verdict.
            return VerifierResult(0.0, "killed", result.exit_code, output)
        return read_reward(logs / REWARD_FILE, result.exit_code, output)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def link_into_verifier(workspace: Path, workdir: str) -> str | None:
    """The first symbolic link of the workspace that points, as the sandbox sees it, into the
    verifier's folders (`/tests`, `/logs`) or `/proc` (an output "file" that is really the
    expected answer), described; None when there is none."""
    for folder, names, files in os.walk(workspace):
        for name in [*names, *files]:
            path = Path(folder, name)
            if not path.is_symlink():
                continue
            inside = PurePosixPath(workdir, path.relative_to(workspace).as_posix())
            target = posixpath.normpath(posixpath.join(str(inside.parent), os.readlink(path)))
            if any(target == root or target.startswith(root + "/") for root in _GUARDED):
                return f"{inside} links to {target}"
    return None


def read_reward(path: Path, exit_code: int, output: str) -> VerifierResult:
    """The result from `reward.json` next to `path` where it exists (Harbor reads it first),
    else from `path` (`reward.txt`)."""
    as_json = path.with_name(PurePosixPath(REWARD_JSON).name)
    for candidate in (as_json, path):
        if candidate.is_symlink():  # would be read on the host: never followed
            return VerifierResult(0.0, "bad_reward_file", exit_code, output)
    try:
        if as_json.exists():
            return reward_from_json(as_json.read_text(errors="replace"), exit_code, output)
        text = path.read_text(errors="replace") if path.exists() else None
    except OSError:
        return VerifierResult(0.0, "bad_reward_file", exit_code, output)
    return reward_from(text, exit_code, output)


def reward_from_json(text: str, exit_code: int, output: str) -> VerifierResult:
    """The result of a verifier that wrote `reward.json`: Harbor's rewards object (names to
    numbers). Its `reward` entry, or its only entry, when that is a number in [0, 1]; anything
    else (no such entry, several without `reward`, not JSON) scores 0 as a bad reward file."""
    bad = VerifierResult(0.0, "bad_reward_file", exit_code, output)
    try:
        rewards = json.loads(text)
    except ValueError:
        return bad
    if isinstance(rewards, dict):
        if "reward" in rewards:
            rewards = rewards["reward"]
        elif len(rewards) == 1:
            rewards = next(iter(rewards.values()))
        else:
            return bad
    if isinstance(rewards, bool) or not isinstance(rewards, int | float):
        return bad
    if not 0.0 <= rewards <= 1.0:  # NaN and infinities fail this too
        return bad
    return VerifierResult(float(rewards), "reward_json", exit_code, output)


def network_failure(
    task: HarborTask, result: VerifierResult, *, network: bool = False
) -> str | None:
    """Why a verifier that gave less than the full reward may have failed for want of network,
    or None. Decided only from what the policy cannot touch: the task's own test scripts
    (`HarborTask.network_fetches`) and, with network, Conveyor's own probe of the hosts those
    scripts fetch from, made from this host. Never from the verifier's output: the tests run the
    policy's code, which could print "Could not resolve host" to turn its failure into an
    infrastructure error (kept out of learning, retried) instead of a 0.

    - Without network: scripts that fetch are enough (fail closed): an infrastructure error.
    - With network: an infrastructure error only where a host the scripts fetch from does not
      answer here (a registry down, a host this network does not reach).
    - A task whose own policy is `no-network`, or a full reward, never."""
    if task.verifier_network_mode == "no-network" or result.reward >= 1.0:
        return None
    if not task.network_fetches:
        return None
    if not network:
        return f"its tests fetch from the network ({task.network_fetches[0]})"
    for host, port in fetch_hosts(task.network_fetches):
        why = unreachable(host, port)
        if why is not None:
            return f"{host}:{port}, which its tests fetch from, does not answer here ({why})"
    return None


# The hosts a fetching tool reaches when its line names no URL.
_TOOL_HOSTS = (
    (re.compile(r"\bapt(-get)?\b"), ("deb.debian.org", 80)),
    (re.compile(r"\b(pip3?|uv|uvx|pipx)\b"), ("pypi.org", 443)),
    (re.compile(r"\b(npm|npx|yarn)\b"), ("registry.npmjs.org", 443)),
)
_URL_HOST = re.compile(r"\b(https?|ftp|git)://([^/\s:'\"]+)(?::(\d+))?")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ftp": 21, "git": 9418}


def fetch_hosts(lines: Sequence[str]) -> list[tuple[str, int]]:
    """The (host, port) pairs the fetch lines of a task's scripts reach: each URL's host, and
    for a package tool without a URL its usual registry."""
    found: dict[tuple[str, int], None] = {}
    for line in lines:
        code = line.split(": ", 1)[-1]
        urls = _URL_HOST.findall(code)
        for scheme, host, port in urls:
            if host.lower() not in {"localhost", "127.0.0.1", "0.0.0.0", "::1"}:
                found[(host.lower(), int(port) if port else _DEFAULT_PORTS[scheme])] = None
        if not urls:
            for pattern, pair in _TOOL_HOSTS:
                if pattern.search(code):
                    found[pair] = None
    return list(found)


def unreachable(host: str, port: int, timeout_s: float = 5.0) -> str | None:
    """None when a TCP connection to `host:port` opens from this host, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def reward_from(text: str | None, exit_code: int, output: str) -> VerifierResult:
    """The result of a verifier that wrote `text` to its reward file (None: no file) and exited
    with `exit_code`: the file's number when it is one in [0, 1], else 0; without a file, the
    exit status."""
    if text is None:
        return VerifierResult(1.0 if exit_code == 0 else 0.0, "exit_status", exit_code, output)
    try:
        value = float(text.strip())
    except ValueError:
        return VerifierResult(0.0, "bad_reward_file", exit_code, output)
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        return VerifierResult(0.0, "bad_reward_file", exit_code, output)
    return VerifierResult(value, "reward_file", exit_code, output)


def _readable(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)


def _give_to_sandbox(folder: Path) -> None:
    if os.geteuid() != 0:
        return
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, SANDBOX_UID, SANDBOX_GID)
