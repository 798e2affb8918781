"""How the `harbor` package (0.25.0) itself reads Harbor task folders: one JSON line per folder.

Run by path with the Python of the harbor venv (`scripts/venv-harbor.sh`), which has no Conveyor
in it, so this file imports only the standard library and `harbor`:

    .venv-harbor/bin/python src/conveyor/tasks/terminal/harbor_view.py FOLDER...

Each line: `{"path", "ok": true, "view": {...}}` or `{"path", "ok": false, "error"}` where
Harbor refuses the folder. `conveyor.tasks.terminal.parity` compares the views with ours.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def harbor_view(folder: Path) -> dict[str, Any]:
    """The fields of `folder` that Conveyor also reads, as `harbor.models.task.task.Task` has
    them."""
    from harbor.models.task.config import TaskOS
    from harbor.models.task.task import Task

    task = Task(folder)
    config = task.config
    explicit = config.verifier.explicit_phase_policy()
    baseline = (config.verifier.environment or config.environment).resolve_baseline()
    test = task.paths.discovered_test_path_for(TaskOS.LINUX)
    solve = task.paths.discovered_solve_path_for(TaskOS.LINUX)
    dockerfile = task.paths.environment_dir / "Dockerfile"
    return {
        "instruction": task.instruction,
        "agent_timeout_s": config.agent.timeout_sec,
        "verifier_timeout_s": float(config.verifier.timeout_sec),
        "verifier_env": dict(config.verifier.env),
        "build_timeout_s": float(config.environment.build_timeout_sec),
        "verifier_network_mode": (explicit or baseline).network_mode.value,
        "test_script": str(test.relative_to(task.paths.task_dir)) if test else None,
        "solution_script": str(solve.relative_to(task.paths.task_dir)) if solve else None,
        "dockerfile": dockerfile.is_file(),
    }


def main(argv: list[str]) -> int:
    for arg in argv:
        folder = Path(arg).resolve()
        try:
            line: dict[str, Any] = {"path": str(folder), "ok": True, "view": harbor_view(folder)}
        except Exception as exc:  # Harbor's refusal, whatever its type, is data
            line = {"path": str(folder), "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    # Run by path, this folder is first on sys.path, and its `harbor.py` (Conveyor's reader)
    # would shadow the package.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.exit(main(sys.argv[1:]))
