"""What `conveyor bridge check` prints: named checks of one backend's encoding of our samples.

Exit codes of the command: 0 every check holds, 1 one failed, 3 the backend is unavailable
here (`BridgeUnavailable`: its package or virtual environment is missing).
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from typing import Any


class BridgeUnavailable(RuntimeError):
    """The backend cannot be checked on this machine; the message says why and how to fix it."""


@dataclass(frozen=True)
class Check:
    """One property of the encoding: its name, whether it holds, and what was seen."""

    name: str
    ok: bool
    detail: str = ""


@dataclass
class CheckReport:
    """The checks of one backend over `samples` training samples."""

    backend: str
    version: str
    samples: int
    checks: list[Check] = field(default_factory=list)
    python: str = field(default_factory=platform.python_version)

    @property
    def ok(self) -> bool:
        """Every check holds, and there was at least one."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        """Record one check."""
        self.checks.append(Check(name, bool(ok), detail))

    def as_json(self) -> dict[str, Any]:
        """The `--json` line: backend, version, python, samples, checks, ok."""
        return {
            "backend": self.backend,
            "version": self.version,
            "python": self.python,
            "samples": self.samples,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
            "ok": self.ok,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckReport:
        """Read back `as_json` (a check run in another virtual environment prints one)."""
        report = cls(
            backend=str(data["backend"]),
            version=str(data["version"]),
            samples=int(data["samples"]),
            python=str(data["python"]),
        )
        for c in data["checks"]:
            report.add(str(c["name"]), bool(c["ok"]), str(c.get("detail", "")))
        return report

    def dumps(self) -> str:
        """One JSON line."""
        return json.dumps(self.as_json())
