"""Release-pair tasks: the tests of release N+1 that fail on release N and pass on N+1.

For consecutive final releases (N, N+1) of a project: `test_patch` takes N's test files to
N+1's, the gold `patch` is the diff of the library's Python sources N -> N+1, FAIL_TO_PASS are
the tests passing with the gold patch and failing (or missing) without it, PASS_TO_PASS those
passing both ways, and the problem statement is N+1's changelog entry. The starting state is the
N sdist as published (empty `setup_patch`): no later history is in it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from conveyor.runtime.workspace import make_workspace
from conveyor.tasks.swe.dataset import PYPI_PREFIX, RowEnvironment, SweRow
from conveyor.tasks.swe.environment import (
    project_metadata,
    project_source,
    swe_home,
    test_environment,
)
from conveyor.tasks.swe.factory import _ignored, verify_row
from conveyor.tasks.swe.grading import TestRun, run_tests
from conveyor.tasks.swe.guards import is_test_file
from conveyor.tasks.swe.patches import apply_patch, diff_trees
from conveyor.tasks.swe.projects import BuildReport, ProjectSpec, detect_layout

log = logging.getLogger(__name__)

_FINAL = re.compile(r"^\d+(\.\d+)*$")
_CHANGELOG = re.compile(r"^(change(s|log)|history|news|release[-_ ]?notes)", re.IGNORECASE)
_VERSION_LINE = re.compile(r"^\W{0,4}v?\d+\.\d+(\.\d+)*\b")
_ENTRY_CHARS = 2500
RELEASE_SLOW_TEST_S = 2.0
RELEASE_TEST_TIMEOUT_S = 30.0


def release_versions(name: str) -> list[str]:
    """Final releases of `name` on the package index, oldest first (one `pip index` lookup)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", name],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("Available versions:"):
            found = [v.strip() for v in line.split(":", 1)[1].split(",")]
            finals = [v for v in found if _FINAL.match(v)]
            return sorted(finals, key=lambda v: tuple(int(x) for x in v.split(".")))
    raise RuntimeError(f"pip index versions {name} listed no versions: {done.stderr.strip()}")


def changelog_entry(root: Path, version: str) -> str | None:
    """The text under `version`'s heading in the sdist's changelog, if one can be found."""
    candidates = [p for p in root.iterdir() if p.is_file() and _CHANGELOG.match(p.name)]
    docs = root / "docs"
    if docs.is_dir():
        candidates += [p for p in docs.rglob("*") if p.is_file() and _CHANGELOG.match(p.name)]
    token = re.compile(rf"(?<![\w.]){re.escape(version)}(?![\w.])")
    for path in candidates:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        for index, line in enumerate(lines):
            if not token.search(line) or len(line) > 120:
                continue
            body: list[str] = []
            for following in lines[index + 1 :]:
                if _VERSION_LINE.match(following) and body and any(b.strip() for b in body):
                    break
                body.append(following)
            text = "\n".join(b for b in body if not set(b.strip()) <= set("-=~^*#")).strip()
            if text:
                return text[:_ENTRY_CHARS]
    return None


def has_tests(root: Path) -> bool:
    """Whether an unpacked sdist ships test modules (some releases of a project do not)."""
    return any(
        is_test_file(p.relative_to(root).as_posix())
        for p in root.rglob("*.py")
        if p.name.startswith("test") or p.name.endswith("_test.py")
    )


async def _run_suite(
    template: Path, patches: list[str], spec: ProjectSpec, pythonpath: str, version: str
) -> TestRun:
    env = await asyncio.to_thread(test_environment, list(spec.extra_test_deps))
    metadata = await asyncio.to_thread(project_metadata, spec.name, version)
    with make_workspace(template, swe_home() / "workspaces") as ws:
        for patch in patches:
            await asyncio.to_thread(apply_patch, ws.path, patch)
        return await run_tests(
            ws.path,
            env,
            paths=list(spec.test_paths) or None,
            pythonpath=pythonpath,
            metadata=metadata,
        )


async def release_pair_row(spec: ProjectSpec, old: str, new: str) -> SweRow | str:
    """The task of the pair (old, new), or why there is none."""
    old_root, _ = await asyncio.to_thread(project_source, spec.name, old)
    new_root, _ = await asyncio.to_thread(project_source, spec.name, new)
    if not has_tests(old_root) or not has_tests(new_root):
        return "no_tests_in_sdist"
    old_layout, new_layout = detect_layout(old_root), detect_layout(new_root)
    if old_layout.pythonpath != new_layout.pythonpath:
        return "layout_changed"
    sources = set(old_layout.source_files) | set(new_layout.source_files)
    gold = diff_trees(old_root, new_root, include=lambda p: p in sources)
    tests = diff_trees(old_root, new_root, include=is_test_file)
    if not gold.strip():
        return "no_source_change"
    if not tests.strip():
        return "no_test_change"
    pythonpath = old_layout.pythonpath
    try:
        before = await _run_suite(old_root, [tests], spec, pythonpath, old)
        after = await _run_suite(old_root, [tests, gold], spec, pythonpath, old)
    except Exception as exc:  # a patch that does not apply to the sdist as published
        return f"patch_failed: {str(exc)[:80]}"
    # slow tests (nth_prime searches, hypothesis runs) time out under load: left out
    passing = {
        t
        for t in after.passed()
        if not _ignored(t, spec) and after.outcome(t).duration <= RELEASE_SLOW_TEST_S
    }
    f2p = sorted(passing - before.passed())
    p2p = sorted(passing & before.passed())
    if not f2p:
        return "no_fail_to_pass"
    entry = changelog_entry(new_root, new)
    statement = (
        f"Bring `{spec.name}` from release {old} to the behaviour of release {new}.\n\n"
        + (f"Release notes of {new}:\n\n{entry}\n\n" if entry else "")
        + "Tests that should pass afterwards include:\n"
        + "".join(f"- `{t}`\n" for t in f2p[:8])
    )
    return SweRow(
        instance_id=f"{spec.name}-{old}__release__{new}",
        repo=f"{PYPI_PREFIX}{spec.name}",
        version=old,
        problem_statement=statement,
        patch=gold,
        test_patch=tests,
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
        environment=RowEnvironment(
            pythonpath=pythonpath, extra_test_deps=list(spec.extra_test_deps)
        ),
        conveyor={"source": "release_pair", "from": old, "to": new, "changelog": entry is not None},
    )


async def build_release_pair_tasks(
    spec: ProjectSpec,
    up_to: str | None = None,
    *,
    max_pairs: int = 3,
    report: BuildReport | None = None,
    say: Callable[[str], None] = log.info,
) -> list[SweRow]:
    """Verified release-pair tasks for the last `max_pairs` consecutive releases up to `up_to`."""
    versions = await asyncio.to_thread(release_versions, spec.name)
    if up_to is not None and up_to in versions:
        versions = versions[: versions.index(up_to) + 1]
    pairs = list(itertools.pairwise(versions))[-max_pairs:]
    rows: list[SweRow] = []
    for old, new in reversed(pairs):
        made = await release_pair_row(spec, old, new)
        if isinstance(made, str):
            say(f"  release pair {old} -> {new}: skipped ({made})")
            if report is not None:
                report.reject(f"release_{made.split(':')[0]}")
            continue
        problem = await verify_row(made, report, RELEASE_TEST_TIMEOUT_S)
        if problem is not None:
            say(f"  release pair {old} -> {new}: rejected ({problem})")
            if report is not None:
                report.reject(f"release_{problem}")
            continue
        rows.append(made)
        if report is not None:
            report.release_pairs += 1
        say(f"  kept {made.instance_id} ({len(made.FAIL_TO_PASS)} F2P)")
    return rows
