"""What the factory knows about a project: its test dependencies and its source layout.

`PROJECTS` holds the development projects of the factory (issue 5); any other PyPI project whose
sdist ships its tests works with defaults (`ProjectSpec(name)`), given its test dependencies.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.tasks.swe.guards import is_test_file
from conveyor.tasks.swe.patches import iter_files

NOT_SOURCE_DIRS = frozenset({"docs", "doc", "examples", "example", "benchmarks", "bench", "build"})
NOT_SOURCE_FILES = frozenset({"setup.py", "conftest.py", "noxfile.py", "fabfile.py", "tasks.py"})


@dataclass(frozen=True)
class ProjectSpec:
    """A factory project: pip test dependencies, where its tests are, tests to leave out."""

    name: str
    extra_test_deps: tuple[str, ...] = ()
    test_paths: tuple[str, ...] = ()
    ignore_tests: tuple[str, ...] = ()


PROJECTS: dict[str, ProjectSpec] = {
    spec.name: spec
    for spec in [
        # test_fold uses multiprocessing (no /dev/shm semaphores in the sandbox).
        ProjectSpec("toolz", ignore_tests=("toolz/sandbox/tests/test_parallel.py",)),
        ProjectSpec("inflection"),
        ProjectSpec("schema", extra_test_deps=("mock",)),
        ProjectSpec("boltons"),
        ProjectSpec("attrs", extra_test_deps=("hypothesis", "cloudpickle")),
        ProjectSpec("more-itertools"),
        ProjectSpec("pyparsing", extra_test_deps=("railroad-diagrams", "jinja2")),
        # Issue 14: projects whose tests need the project installed (its metadata, its own
        # entry points): Markdown finds its built-in extensions through its entry points,
        # stevedore loads the test plugins its own setup.cfg declares, keyring's packaging
        # tests read its entry points. Their runtime dependencies are test dependencies here,
        # since the project itself is installed without them.
        ProjectSpec("markdown", extra_test_deps=("pyyaml",)),
        ProjectSpec("stevedore", extra_test_deps=("testtools",)),
        ProjectSpec(
            "keyring",
            extra_test_deps=(
                "jaraco.classes",
                "jaraco.functools",
                "jaraco.context",
                "importlib_metadata",
            ),
        ),
    ]
}


def spec_for(name: str) -> ProjectSpec:
    """The known spec of `name`, or defaults."""
    return PROJECTS.get(name, ProjectSpec(name))


@dataclass
class ProjectLayout:
    """Where a project's importable code and its library sources are inside the sdist."""

    pythonpath: str
    source_files: list[str] = field(default_factory=list)


def detect_layout(root: Path) -> ProjectLayout:
    """`src/` layout or flat; library files: packages and top-level modules, tests excluded."""
    src = root / "src"
    pythonpath = "src" if src.is_dir() and any(src.glob("*/__init__.py")) else "."
    base = root / pythonpath
    files: list[str] = []
    for rel in iter_files(base):
        parts = rel.split("/")
        if not rel.endswith(".py") or is_test_file(rel) or parts[-1] in NOT_SOURCE_FILES:
            continue
        if parts[0] in NOT_SOURCE_DIRS or any(p.startswith(".") for p in parts):
            continue
        in_package = len(parts) > 1 and (base / parts[0] / "__init__.py").exists()
        if len(parts) == 1 or in_package:
            files.append(rel if pythonpath == "." else f"{pythonpath}/{rel}")
    return ProjectLayout(pythonpath=pythonpath, source_files=files)


@dataclass
class BuildReport:
    """Yield of one factory build: what was tried, kept and rejected (and why)."""

    project: str
    version: str
    candidates: int = 0
    tried: int = 0
    kept: int = 0
    release_pairs: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    baseline_tests: int = 0
    slow_tests: int = 0
    baseline_seconds: float = 0.0
    grade_seconds: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def reject(self, reason: str) -> None:
        """Count a rejected candidate."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def as_dict(self) -> dict[str, object]:
        """A JSON-able summary with yield and timings."""
        grades = sorted(self.grade_seconds)
        return {
            "project": self.project,
            "version": self.version,
            "mutation_candidates": self.candidates,
            "mutants_tried": self.tried,
            "mutation_tasks": self.kept,
            "yield": round(self.kept / self.tried, 3) if self.tried else 0.0,
            "release_pair_tasks": self.release_pairs,
            "kinds": dict(sorted(self.kinds.items())),
            "rejected": dict(sorted(self.rejected.items())),
            "baseline_tests": self.baseline_tests,
            "slow_tests_left_out": self.slow_tests,
            "baseline_seconds": round(self.baseline_seconds, 2),
            "grade_seconds_median": round(grades[len(grades) // 2], 2) if grades else None,
            "seconds": round(time.monotonic() - self.started, 1),
        }

    def to_json(self) -> str:
        """One JSON line."""
        return json.dumps(self.as_dict())
