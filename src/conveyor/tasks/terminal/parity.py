"""Our reading of Harbor task folders against the `harbor` package's own (`conveyor tasks
harbor-parity`).

`harbor_view.py` runs in the harbor venv (`scripts/venv-harbor.sh`: harbor 0.25.0 needs Python
>= 3.12, and its pins are not ours) and prints, per folder, what `harbor.models.task.task.Task`
reads: the instruction (canary lines dropped), the agent's, verifier's and build's time limits,
the verifier's variables and network policy, where the test and solution scripts are, whether
there is a Dockerfile, or Harbor's refusal. `compare` puts our `HarborTask` beside it, field by
field. Known, documented differences are not mismatches: where a folder sets no
`[agent].timeout_sec` Harbor sets no limit and we use 600 s per command; our name is the folder's
(Harbor's is `[task].name` where set).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.tasks.terminal.harbor import (
    DEFAULT_AGENT_TIMEOUT_S,
    HarborFormatError,
    HarborTask,
    load_task,
)

VIEW_SCRIPT = Path(__file__).with_name("harbor_view.py")
VENV_ENV = "CONVEYOR_HARBOR_VENV"


def harbor_python(venv: Path | None = None) -> Path:
    """The harbor venv's Python: `venv`, else `$CONVEYOR_HARBOR_VENV`, else `.venv-harbor` of
    this checkout."""
    if venv is None:
        configured = os.environ.get(VENV_ENV)
        venv = Path(configured) if configured else Path(__file__).parents[4] / ".venv-harbor"
    return Path(venv) / "bin" / "python"


def our_view(task: HarborTask) -> dict[str, Any]:
    """The same fields as `harbor_view.harbor_view`, as we read them."""
    tests = task.path / "tests" / "test.sh"
    solve = task.path / "solution" / "solve.sh"
    return {
        "instruction": task.instruction,
        "agent_timeout_s": task.agent_timeout_s,
        "verifier_timeout_s": task.verifier_timeout_s,
        "verifier_env": task.verifier_env,
        "build_timeout_s": task.build_timeout_s,
        "verifier_network_mode": task.verifier_network_mode,
        "test_script": str(tests.relative_to(task.path)) if tests.is_file() else None,
        "solution_script": str(solve.relative_to(task.path)) if solve.is_file() else None,
        "dockerfile": (task.path / "environment" / "Dockerfile").is_file(),
    }


@dataclass
class ParityReport:
    """Per folder: `agree` (same fields, or both refuse it) or the fields that differ."""

    folders: int = 0
    agree: int = 0
    mismatches: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every folder agreed."""
        return not self.mismatches and self.agree == self.folders

    def as_json(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "folders": self.folders,
            "agree": self.agree,
            "mismatches": self.mismatches,
            "ok": self.ok,
        }


def harbor_views(folders: list[Path], python: Path) -> dict[str, dict[str, Any]]:
    """Harbor's reading of each folder, by resolved path (runs `harbor_view.py` in the venv)."""
    if not python.exists():
        raise FileNotFoundError(
            f"no harbor venv at {python.parents[1]} (build it with scripts/venv-harbor.sh, or "
            f"name one with --venv or ${VENV_ENV})"
        )
    done = subprocess.run(
        [str(python), str(VIEW_SCRIPT), *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"harbor_view.py failed: {done.stderr.strip()[-2000:]}")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {line["path"]: line for line in lines}


def compare(folders: list[Path], python: Path) -> ParityReport:
    """Our reading of every folder beside Harbor's (see the module doc)."""
    resolved = [Path(f).resolve() for f in folders]
    theirs = harbor_views(resolved, python)
    report = ParityReport(folders=len(resolved))
    for folder in resolved:
        key = str(folder)
        harbor = theirs.get(key)
        if harbor is None:
            report.mismatches[key] = ["harbor_view.py printed nothing for it"]
            continue
        try:
            ours: dict[str, Any] | None = our_view(load_task(folder))
            our_error = ""
        except HarborFormatError as exc:
            ours, our_error = None, str(exc)
        if ours is None or not harbor["ok"]:
            if ours is None and not harbor["ok"]:
                report.agree += 1  # both refuse it
            else:
                report.mismatches[key] = [
                    f"ours: {our_error or 'reads it'}; harbor: {harbor.get('error') or 'reads it'}"
                ]
            continue
        differences = _differences(ours, harbor["view"])
        if differences:
            report.mismatches[key] = differences
        else:
            report.agree += 1
    return report


def _differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    out = []
    for name, value in theirs.items():
        mine = ours.get(name)
        if name == "agent_timeout_s" and value is None:
            value = DEFAULT_AGENT_TIMEOUT_S  # Harbor: no limit; ours: the documented default
        if mine != value:
            out.append(f"{name}: ours {mine!r}, harbor {value!r}")
    return out
