"""`conveyor.engines.server_guard`: a server (and what it spawned) ends with its owner.

Real processes: an owner (standing for a Ray actor) starts the guard in a session of its own,
the guard a "server" that spawns a child (standing for vLLM's engine core); the owner is then
killed with SIGKILL, as Ray kills the actors of a run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from processes import alive, children_of

SERVER = (
    "import subprocess, sys, time; "
    "core = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "print(core.pid, flush=True); time.sleep(600)"
)


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_the_server_and_its_children_end_when_the_owner_is_killed(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    owner_code = (
        "import os, subprocess, sys, time\n"
        "guard = subprocess.Popen([sys.executable, '-m', 'conveyor.engines.server_guard', "
        f"str(os.getpid()), '--', sys.executable, '-c', {SERVER!r}], "
        f"stdout=open({str(pids)!r}, 'w'), start_new_session=True)\n"
        f"open({str(pids)!r} + '.guard', 'w').write(str(guard.pid))\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", owner_code])
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    guard = int(Path(f"{pids}.guard").read_text())
    core = int(pids.read_text())
    server = children_of(guard)
    assert len(server) == 1 and alive(core)
    try:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        # the guard notices within a second, stops the server, then the rest of its group
        assert _wait_gone([*server, core, guard], 20) == []
    finally:
        for pid in (*server, core, guard):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_while_the_owner_lives_the_guard_passes_on_the_servers_exit_code() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor.engines.server_guard",
            str(os.getpid()),
            "--",
            sys.executable,
            "-c",
            "raise SystemExit(7)",
        ],
        timeout=60,
    )
    assert done.returncode == 7


def test_a_malformed_command_line_is_refused_with_its_usage() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.engines.server_guard", "x", "sleep", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "usage:" in done.stderr
