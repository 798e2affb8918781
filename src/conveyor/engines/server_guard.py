"""Run a server that dies with the process that started it.

    python -m conveyor.engines.server_guard PARENT_PID -- COMMAND...

Starts COMMAND as a child, waits for it, and exits with its exit code. Once PARENT_PID is no
longer this guard's parent (it died: killed by Ray with the actor that owned the server, say),
the guard sends COMMAND SIGTERM, waits up to `STOP_WAIT_S` for it, then ends the rest of its
process group (SIGTERM, then SIGKILL).
The guard is meant to lead its own process group (`ServerProcess` starts it so): the group then
holds the server and whatever it spawned (vLLM's engine core), and stopping the group stops all.

Why: a Ray actor killed with SIGKILL (`ray.kill`, or its driver's end) runs no clean-up, and a
server in a session of its own would outlive it, holding memory and a port.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 1.0
STOP_WAIT_S = 30.0
GROUP_WAIT_S = 5.0


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print(
            "usage: python -m conveyor.engines.server_guard PARENT_PID -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    parent, command = int(argv[0]), argv[2:]
    child = subprocess.Popen(command)
    while True:
        try:
            return child.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            break
    child.terminate()
    try:
        child.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        pass
    if os.getpgrp() == os.getpid():
        # what the server spawned (vLLM's engine core) may outlive it: the rest of the group
        # goes too, this guard last (its parent is gone; no one reads its exit code)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(os.getpgrp(), signal.SIGTERM)
        time.sleep(GROUP_WAIT_S)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
