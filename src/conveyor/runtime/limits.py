"""Resource limits for sandboxed commands and the process handling every runtime shares.

A command runs as its own process group under `prlimit` (address space, CPU time, file size,
process count, open files, no core dumps), its output is read into a byte-capped buffer, and on
timeout, cancellation or exit the whole group is SIGKILLed. Every process also carries a marker
environment variable, so leftovers that left the group (`setsid`, double forks) can be found in
`/proc` and killed too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from conveyor.runtime.base import ExecResult

MARKER_ENV = "CONVEYOR_SANDBOX_ID"
"""Environment variable every sandboxed process carries: its runtime's id."""

SANDBOX_UID = 65534
"""The unprivileged host user sandboxed commands run as (`nobody` on Debian)."""

SANDBOX_GID = 65534
"""The group sandboxed commands run as (`nogroup` on Debian)."""

TIMEOUT_EXIT_CODE = 124
_READ_CHUNK = 65536
_DRAIN_GRACE_S = 2.0

GiB = 1 << 30
MiB = 1 << 20


class SandboxLimits(BaseModel):
    """Per-command resource limits; each process of a command gets them (rlimits are per process).

    `max_processes` only binds for a non-root user (the kernel exempts root), which is why the
    bubblewrap runtime drops to `SANDBOX_UID` inside a user namespace of its own: the count is
    then per sandbox, not shared by every sandbox running as that user.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_bytes: int = Field(4 * GiB, gt=0, description="RLIMIT_AS: virtual memory per process")
    cpu_seconds: int = Field(600, gt=0, description="RLIMIT_CPU: CPU seconds per process")
    file_size_bytes: int = Field(1 * GiB, gt=0, description="RLIMIT_FSIZE: largest file written")
    max_processes: int = Field(256, gt=0, description="RLIMIT_NPROC: processes of the user")
    open_files: int = Field(4096, gt=0, description="RLIMIT_NOFILE")
    output_bytes: int = Field(1 * MiB, gt=0, description="captured bytes per stream (head+tail)")
    tmp_bytes: int = Field(512 * MiB, gt=0, description="size of a tmpfs /tmp (probe, docker)")


def prlimit_argv(limits: SandboxLimits) -> list[str]:
    """`prlimit ... --` setting soft = hard limits (so a command cannot raise them again).

    CPU time gets one extra second of hard limit: SIGXCPU at the soft limit, SIGKILL after.
    """
    return [
        "prlimit",
        f"--as={limits.memory_bytes}",
        f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
        f"--fsize={limits.file_size_bytes}",
        f"--nproc={limits.max_processes}",
        f"--nofile={limits.open_files}",
        "--core=0",
        "--",
    ]


class CappedBuffer:
    """Collects a stream's bytes, keeping at most `limit` of them: the head and the tail."""

    def __init__(self, limit: int):
        self.limit = limit
        self.total = 0
        self._head = bytearray()
        self._tail = bytearray()

    def feed(self, data: bytes) -> None:
        """Add bytes; beyond the head's half only the most recent half-limit bytes are kept."""
        self.total += len(data)
        head_room = self.limit // 2 - len(self._head)
        if head_room > 0:
            self._head += data[:head_room]
            data = data[head_room:]
        if data:
            self._tail += data
            keep = self.limit - self.limit // 2
            if len(self._tail) > keep:
                del self._tail[: len(self._tail) - keep]

    def text(self) -> str:
        """Decoded content with a marker where bytes were dropped."""
        dropped = self.total - len(self._head) - len(self._tail)
        if dropped <= 0:
            return (bytes(self._head) + bytes(self._tail)).decode("utf-8", errors="replace")
        head = bytes(self._head).decode("utf-8", errors="replace")
        tail = bytes(self._tail).decode("utf-8", errors="replace")
        return f"{head}\n[... {dropped} bytes of output truncated ...]\n{tail}"


def kill_process_group(pgid: int) -> None:
    """SIGKILL a whole process group; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def find_marked(marker: str) -> list[int]:
    """Pids of live processes whose `MARKER_ENV` is `marker` or `marker.<anything>`.

    Runtimes mark each command `<runtime id>.<n>`: a command's leftovers are found by its own
    marker, all of a runtime's by the runtime id. Needs read access to /proc/*/environ.
    """
    needle = f"{MARKER_ENV}={marker}".encode()
    nested = needle + b"."
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(v == needle or v.startswith(nested) for v in environ.split(b"\0")):
            found.append(int(entry.name))
    return found


def kill_marked(marker: str, *, rounds: int = 50) -> int:
    """SIGKILL every process `find_marked` finds, again until none is left; returns how many."""
    killed = 0
    for _ in range(rounds):
        pids = find_marked(marker)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def exit_code(returncode: int) -> int:
    """A shell-style exit status: death by signal N reads as 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


async def run_limited(
    argv: Sequence[str],
    *,
    timeout_s: float,
    output_bytes: int,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    cleanup: Callable[[], object] | None = None,
    pass_fds: Sequence[int] = (),
) -> ExecResult:
    """Run `argv` in a new session, capture capped output, kill its process group at the end.

    On timeout returns `ExecResult(exit_code=124, timed_out=True)` with the output so far. If the
    awaiting task is cancelled the group is killed before `CancelledError` propagates. `cleanup`
    runs after every command (e.g. killing marked processes that left the group). The caller's
    argv is expected to apply the rlimits (see `prlimit_argv`). `pass_fds` stay open in the
    command (e.g. a channel the command writes and only the caller can read).
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )
    out, err = CappedBuffer(output_bytes), CappedBuffer(output_bytes)
    assert proc.stdout is not None and proc.stderr is not None
    readers = [
        asyncio.create_task(_drain(proc.stdout, out)),
        asyncio.create_task(_drain(proc.stderr, err)),
    ]
    timed_out = False
    try:
        if stdin is not None:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            proc.stdin.close()
        try:
            # Not `proc.wait()`: it also waits for the pipes, which a background child may hold.
            await asyncio.wait_for(_exit_of(proc.pid), timeout_s)
        except TimeoutError:
            timed_out = True
    finally:
        # Also on success: background children of the command must not outlive it.
        kill_process_group(proc.pid)
        if cleanup is not None:
            cleanup()
        _, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE_S)
        for task in pending:
            task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), _DRAIN_GRACE_S)
    if timed_out:
        return ExecResult(
            exit_code=TIMEOUT_EXIT_CODE, stdout=out.text(), stderr=err.text(), timed_out=True
        )
    returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    return ExecResult(exit_code=exit_code(returncode), stdout=out.text(), stderr=err.text())


async def _exit_of(pid: int) -> None:
    """Return once process `pid` has exited (a pidfd becomes readable), reaped or not."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def mark() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(fd, mark)
    try:
        await exited
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _drain(stream: asyncio.StreamReader, buffer: CappedBuffer) -> None:
    while chunk := await stream.read(_READ_CHUNK):
        buffer.feed(chunk)
