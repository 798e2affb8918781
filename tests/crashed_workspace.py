"""A workspace left behind by a process that died without cleaning up (shared by the runtime and
SWE tests of the start-up sweep)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_CRASH = (
    "import os, sys\nfrom pathlib import Path\n"
    "from conveyor.runtime.workspace import make_workspace\n"
    "w = make_workspace(Path(sys.argv[1]), Path(sys.argv[2]))\n"
    "print(w.path, flush=True)\nos._exit(9)\n"
)


def orphan_workspace(template: Path, root: Path) -> Path:
    """Make a workspace of `template` under `root` in a child process that is then killed."""
    done = subprocess.run(
        [sys.executable, "-c", _CRASH, str(template), str(root)], capture_output=True, text=True
    )
    assert done.returncode == 9, done.stderr
    orphan = Path(done.stdout.strip())
    assert orphan.exists()
    return orphan
