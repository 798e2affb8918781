"""The OCI engine a container runtime drives: podman or docker, through its command-line client.

The two clients take the same arguments for everything Conveyor does (`run`, `exec`, `rm`,
`ps`, `inspect`, `build`, `import`, `cp`), so an `Engine` is only which client to call and
the environment to call it with:

- `runtime.engine: auto` takes podman where it answers, else docker; `podman` or `docker`
  names one (`resolve_engine`).
- podman reads Conveyor's own `containers.conf` (`podman_conf`: the cgroupfs manager, no
  default ulimits, the runc runtime, file logs: what root podman needs on a host without
  systemd and with hybrid cgroups, where crun fails on setrlimit) through `CONTAINERS_CONF`,
  so a user's own configuration files are never touched. A user who sets `CONTAINERS_CONF`
  keeps theirs; `CONVEYOR_CONTAINERS_CONF` names another file, or turns ours off when empty.
- Every container is labelled with this host and its owner process (pid and start time);
  `sweep_leftovers` removes the containers whose owner is gone (a run killed with SIGKILL
  never ran its `rm -f`), and the images committed from them (they keep the labels). The
  runtime sweeps once per process, at its first start.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.models import cache_dir

log = logging.getLogger(__name__)

ENGINE_NAMES = ("podman", "docker")
SANDBOX_LABEL = "conveyor.sandbox"
HOST_LABEL = "conveyor.host"
OWNER_LABEL = "conveyor.owner"
CONF_ENV = "CONVEYOR_CONTAINERS_CONF"

PODMAN_CONF = """\
# Written by Conveyor (conveyor.runtime.engine.podman_conf, scripts/bootstrap.sh). Only
# Conveyor's own podman calls read it (through CONTAINERS_CONF); yours are unaffected.
[containers]
# No ulimits by default: runc applies only the ones each container asks for.
default_ulimits = []
log_driver = "k8s-file"

[engine]
# No systemd here: podman manages the cgroups itself (cgroup v1 or hybrid hosts included).
cgroup_manager = "cgroupfs"
events_logger = "file"
# crun fails on setrlimit and hybrid cgroups on such hosts; runc works.
runtime = "runc"
"""


@dataclass(frozen=True)
class Engine:
    """A container engine's client: `name` (podman or docker) and how to call it."""

    name: str
    client: str
    env: Mapping[str, str] | None = field(default=None, compare=False)

    @property
    def cwd(self) -> Path:
        """Where the client runs: podman's conmon, a child of it, writes a file named `oom`
        into its working folder when a container's process is OOM-killed."""
        path = cache_dir() / "containers" / "cwd"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def argv(self, *args: str) -> list[str]:
        """The client's argv for `args`."""
        return [self.client, *args]

    def run(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the client synchronously; a missing client or a hang raises `OSError`."""
        try:
            return subprocess.run(
                self.argv(*args),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
            )
        except subprocess.TimeoutExpired as exc:
            raise OSError(
                f"`{self.client} {args[0]}` did not answer within {timeout_s:g} s"
            ) from exc


def engine_of(client: str) -> Engine:
    """The engine behind a client name or path (podman when its file name says so)."""
    name = "podman" if "podman" in Path(client).name else "docker"
    return Engine(name, client, _podman_env() if name == "podman" else None)


def podman_conf() -> Path | None:
    """The containers.conf Conveyor's podman calls read: `$CONVEYOR_CONTAINERS_CONF` if set
    (None when set empty), else `<cache>/containers/containers.conf`, written once."""
    if (named := os.environ.get(CONF_ENV)) is not None:
        return Path(named) if named else None
    path = cache_dir() / "containers" / "containers.conf"
    if not path.is_file() or path.read_text() != PODMAN_CONF:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as tmp:
            tmp.write(PODMAN_CONF)
        os.replace(tmp.name, path)
    return path


def _podman_env() -> dict[str, str] | None:
    if "CONTAINERS_CONF" in os.environ:
        return None  # the user's own
    conf = podman_conf()
    return None if conf is None else {**os.environ, "CONTAINERS_CONF": str(conf)}


@functools.cache
def engine_available(engine: Engine) -> tuple[bool, str]:
    """Whether `engine` answers (`info`), and what it is or why not."""
    template = "{{.Version.Version}}" if engine.name == "podman" else "{{.ServerVersion}}"
    try:
        done = engine.run("info", "--format", template, timeout_s=20)
    except FileNotFoundError:
        return False, f"no `{engine.client}` client on PATH"
    except OSError as exc:
        return False, str(exc)
    if done.returncode != 0:
        reason = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return False, f"`{engine.client} info` failed: {reason[-1] if reason else done.returncode}"
    return True, f"{engine.name} {done.stdout.strip()}"


def resolve_engine(choice: str = "auto") -> Engine:
    """The engine `runtime.engine` names; `auto`: podman where it answers, else docker (whose
    `start` then says why neither is usable)."""
    if choice != "auto":
        if choice not in ENGINE_NAMES:
            raise ValueError(f"runtime.engine must be auto, podman or docker, got {choice!r}")
        return engine_of(choice)
    podman = engine_of("podman")
    if shutil.which("podman") and engine_available(podman)[0]:
        return podman
    return engine_of("docker")


def _start_time(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(fields[19])
    return None


def owner_labels() -> dict[str, str]:
    """The labels marking a container as this process's: host, pid and the pid's start time."""
    pid = os.getpid()
    return {
        SANDBOX_LABEL: "1",
        HOST_LABEL: socket.gethostname(),
        OWNER_LABEL: f"{pid}:{_start_time(pid)}",
    }


def _owner_alive(owner: str) -> bool:
    pid, _, started = owner.partition(":")
    try:
        return str(_start_time(int(pid))) == started
    except ValueError:
        return True  # not a label we wrote: leave the container alone


def _stale(engine: Engine, listing: list[str], inspect: list[str], key: str) -> list[str]:
    """The `key` (`.Name`, `.Id`) of each object `listing` finds (this host's Conveyor ones)
    whose owner is gone."""
    host = socket.gethostname()
    filters = ["--filter", f"label={SANDBOX_LABEL}=1", "--filter", f"label={HOST_LABEL}={host}"]
    listed = engine.run(*listing, *filters, timeout_s=60)
    ids = listed.stdout.split() if listed.returncode == 0 else []
    if not ids:
        return []
    template = f'{{{{index .Config.Labels "{OWNER_LABEL}"}}}}'
    inspected = engine.run(*inspect, "--format", f"{{{{{key}}}}} {template}", *ids, timeout_s=60)
    stale = []
    for line in inspected.stdout.splitlines():
        name, _, owner = line.strip().partition(" ")
        if name and owner and not _owner_alive(owner):
            stale.append(name.lstrip("/"))
    return stale


def sweep_leftovers(engine: Engine) -> list[str]:
    """Remove this host's Conveyor containers whose owner process is gone, then the images
    committed from them (a terminal task's `-verify` image, which carries its container's
    labels); the names and ids removed.

    Those of live runs (this one included) are left alone, so concurrent runs on one host are
    safe. Failures are logged, never raised: a sweep must not stop a start."""
    removed: list[str] = []
    try:
        for what, listing, inspect, key, remove in (
            ("containers", ["ps", "-a", "-q"], ["inspect"], ".Name", ["rm", "-f", "-v"]),
            ("images", ["images", "-q"], ["image", "inspect"], ".Id", ["rmi", "-f"]),
        ):
            stale = _stale(engine, listing, inspect, key)
            if not stale:
                continue
            done = engine.run(*remove, *stale, timeout_s=300)
            if done.returncode != 0:
                log.warning("could not remove leftover %s: %s", what, done.stderr.strip())
            log.info("removed %d %s left by runs that are gone", len(stale), what)
            removed += stale
        return removed
    except OSError as exc:
        log.warning("could not sweep leftover containers: %s", exc)
        return removed


_SWEPT: set[Engine] = set()


def sweep_once(engine: Engine) -> list[str]:
    """`sweep_leftovers`, the first time this process asks for `engine`; else nothing."""
    if engine in _SWEPT:
        return []
    _SWEPT.add(engine)
    return sweep_leftovers(engine)
