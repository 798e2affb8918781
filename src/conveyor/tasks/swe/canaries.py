"""Canary tests: hidden tests that must fail, so a forged verdict gives itself away.

The library under test runs in the process that reports the test outcomes, and no secret that
process holds survives code running beside it. What it cannot do without solving the task is
tell a real test from a copy of it that expects a wrong value. So for each row a few canaries
are made (`canary_candidates`: copies of FAIL_TO_PASS tests, PASS_TO_PASS ones if too few, from
the hidden test modules the row's `test_patch` creates or changes, with one expected value made
wrong and a plausible name) and inserted after their originals when the row is graded; their
node ids join the selection in one sorted list, so which ids are canaries exists only in the
grader's process. Under honest code a canary fails like its original would if it got that wrong
value; anything that turns failures into passes (a plugin, an import hook, rewritten reports, a
forged outcome stream, an object equal to everything) turns the canaries into passes too.

- `row_canaries(row, options)`: the row's canaries (at most `options.canaries`; [] when 0).
  They are validated once per row: the GOLD patch is graded with every candidate inserted (a real
  sandboxed run), and only candidates that fail (call phase, `AssertionError`) are kept, and only
  if every F2P and P2P test still passes beside them. The result (kept canaries, or none and
  why) is cached under `<swe_home>/canaries`, keyed by the row's content, the test venv and
  `GENERATOR_VERSION`; written atomically under a lock, so concurrent graders validate once.
- `insert_canaries(root, canaries)`: put them into a workspace's test modules (only where the
  module is byte for byte the one they were made for).
- `check(canaries, run, semantics)`: after the run. A canary that passed (or xpassed) while its
  original counts as passing is tampering: the same expression cannot equal both values. One
  whose original did not pass says nothing (the row is not resolved anyway, and honest code can
  make it pass: an off-by-one bug may return just the wrong value a canary expects). A canary
  that neither failed (or xfailed) nor passed (not run, skipped, errored) while its original
  passed leaves the row unresolved, but is not counted as tampering.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.runtime.cpu_pools import run_in_pool
from conveyor.runtime.workspace import make_workspace
from conveyor.tasks.swe.canary_candidates import (
    Canary,
    insert_text,
    make_candidate,
    module_digest,
    names_in,
)
from conveyor.tasks.swe.dataset import SweRow
from conveyor.tasks.swe.environment import safe_name, swe_home
from conveyor.tasks.swe.patches import PatchError, apply_patch, patch_paths
from conveyor.tasks.swe.test_run import Semantics, TestRun

if TYPE_CHECKING:
    from conveyor.tasks.swe.options import GradingOptions

__all__ = ["Canary", "CanaryCheck", "check", "insert_canaries", "row_canaries"]

# Bump when candidates or their validation change: cached validations of older ones are redone.
GENERATOR_VERSION = 2
# Candidates validated per row (the first that hold are used, up to `GradingOptions.canaries`).
CANDIDATES = 4
_LOCK_POLL_S = 0.1


@dataclass
class Validation:
    """What the gold run decided for one row: the canaries kept, or none and why."""

    canaries: list[Canary]
    candidates: int
    reason: str | None = None
    seconds: float = 0.0
    renamed: bool = False


@dataclass
class CanaryCheck:
    """How the canaries of one graded run came out."""

    ran: int = 0
    tampered: list[str] = field(default_factory=list)
    did_not_fail: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        """Every canary failed, as it must."""
        return not self.tampered and not self.did_not_fail


async def row_canaries(row: SweRow, options: GradingOptions) -> list[Canary]:
    """The row's validated canaries, at most `options.canaries` ([] when 0: none made).

    The one switch for the whole defence: a test replaces it to grade without canaries."""
    if options.canaries <= 0:
        return []
    validation = await validated(row, options)
    return validation.canaries[: options.canaries]


def hidden_modules(row: SweRow) -> list[str]:
    """The Python files the row's hidden test patch creates or changes, less those its gold
    patch changes too (the grader would not see the gold's version of them)."""
    gold = patch_paths(row.patch)
    return sorted(p for p in patch_paths(row.test_patch) if p.endswith(".py") and p not in gold)


def candidates(
    row: SweRow, root: Path, limit: int = CANDIDATES, swap: bool | None = None
) -> list[Canary]:
    """Up to `limit` canaries for the row, made from its tests in `root` (its starting state
    with the hidden test patch applied): F2P tests first, then P2P ones; one per test function
    (a parametrized test's first selected parameter id). `swap`: whether copies take their
    original's name (default: a coin per test from the row's hash; False for none); never for
    a test the row lists with several parameter ids, which would all have to move."""
    modules = set(hidden_modules(row))
    parsed: dict[str, tuple[bytes, ast.Module, set[str]]] = {}
    seen: set[str] = set()
    found: list[Canary] = []
    seed = row_key(row)
    tests = [*row.FAIL_TO_PASS, *row.PASS_TO_PASS]
    listed = Counter(nodeid.split("[", 1)[0] for nodeid in dict.fromkeys(tests))
    for nodeid in tests:
        if len(found) >= limit:
            break
        path = nodeid.split("::")[0]
        function = nodeid.split("[", 1)[0]
        if path not in modules or function in seen:
            continue
        seen.add(function)
        if path not in parsed:
            try:
                data = (root / path).read_bytes()
                tree = ast.parse(data.decode("utf-8"))
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                modules.discard(path)
                continue
            parsed[path] = (data, tree, names_in(tree))
        data, tree, taken = parsed[path]
        movable = swap if listed[function] == 1 else False
        canary = make_candidate(path, data, tree, nodeid, taken, seed, movable)
        if canary is not None:
            found.append(canary)
    return found


def insert_canaries(root: Path, canaries: Sequence[Canary]) -> list[Canary]:
    """Insert `canaries` into the test modules under `root`; those whose module is not the one
    they were made for are left out (they will not run) and not returned."""
    by_path: dict[str, list[Canary]] = {}
    for canary in canaries:
        by_path.setdefault(canary.path, []).append(canary)
    inserted: list[Canary] = []
    for path, group in by_path.items():
        target = root / path
        try:
            data = target.read_bytes()
        except OSError:
            continue
        fitting = [c for c in group if c.module_sha256 == module_digest(data)]
        if fitting:
            target.write_bytes(insert_text(data.decode("utf-8"), fitting).encode("utf-8"))
            inserted += fitting
    return inserted


def selection(row: SweRow, canaries: Sequence[Canary]) -> list[str]:
    """The node ids to run: the row's tests under the names they run as, and the canaries, in
    one sorted list (nothing in it tells a canary apart)."""
    tests = [*row.FAIL_TO_PASS, *row.PASS_TO_PASS]
    return sorted({*tests, *(c.nodeid for c in canaries), *(c.real for c in canaries)})


def as_listed(run: TestRun, canaries: Sequence[Canary]) -> TestRun:
    """`run` as the row lists its tests: the canaries' outcomes left out, and a real test that
    ran under another name (its copy took its name) under its own again."""
    real = {c.real: c.original for c in canaries}
    left_out = {c.nodeid for c in canaries} | set(real)
    outcomes = {k: v for k, v in run.outcomes.items() if k not in left_out}
    for runs_as, original in real.items():
        if runs_as in run.outcomes:
            outcomes[original] = dataclasses.replace(run.outcomes[runs_as], nodeid=original)
    collected = [n for n in run.collected if n not in left_out]
    collected += [original for runs_as, original in real.items() if runs_as in run.collected]
    return dataclasses.replace(run, outcomes=outcomes, collected=collected)


def check(canaries: Sequence[Canary], run: TestRun, semantics: Semantics = "strict") -> CanaryCheck:
    """How the canaries came out in `run` (see the module doc). A canary whose original did
    not pass is passed over: that row is not resolved whatever the canary did. An xfailed
    canary is a failure that was expected: fine (the `swebench` semantics count an xfailed
    original as passing, so library code calling `pytest.xfail` resolves there, as it does in
    SWE-bench's report; the strict reward never counts it)."""
    result = CanaryCheck()
    for canary in canaries:
        outcome = run.outcome(canary.nodeid).outcome
        result.ran += outcome != "missing"
        original = run.outcome(canary.real)
        if not (original.passes(semantics) or original.outcome == "xpassed"):
            continue
        if outcome in ("passed", "xpassed"):
            result.tampered.append(canary.nodeid)
        elif outcome not in ("failed", "xfailed"):
            result.did_not_fail.append(f"{canary.nodeid} ({outcome})")
    return result


def row_key(row: SweRow) -> str:
    """A hash of everything about the row that decides its canaries."""
    content = {
        "instance_id": row.instance_id,
        "patch": row.patch,
        "test_patch": row.test_patch,
        "FAIL_TO_PASS": row.FAIL_TO_PASS,
        "PASS_TO_PASS": row.PASS_TO_PASS,
        "environment": row.env.model_dump(mode="json"),
        "generator": GENERATOR_VERSION,
        "candidates": CANDIDATES,
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


async def validated(row: SweRow, options: GradingOptions) -> Validation:
    """The row's validation, from the cache or made now (once, under a lock)."""
    from conveyor.tasks.swe import grading  # the grader runs the canaries: no import loop

    env = await run_in_pool("reward", grading.row_environment, row, options)
    key = hashlib.sha256(f"{row_key(row)}/{env.path.name}".encode()).hexdigest()[:20]
    path = swe_home() / "canaries" / f"{safe_name(row.instance_id)[:80]}-{key}.json"
    cached = _read(path)
    if cached is not None:
        return cached
    async with _locked(f"canaries-{key}"):
        cached = _read(path)
        if cached is not None:
            return cached
        validation = await validate(row, options)
        _write(path, validation)
        return validation


async def validate(row: SweRow, options: GradingOptions) -> Validation:
    """Grade the gold patch with every candidate inserted and keep those that fail (see the
    module doc); if the real tests do not all pass beside them and some originals were renamed
    (a test may depend on its own name), once more with none renamed. Never raises for a row it
    cannot validate: no canaries, and why."""
    start = time.monotonic()
    validation = await _validate(row, options, swap=None)
    if not validation.canaries and validation.renamed:
        validation = await _validate(row, options, swap=False)
    validation.seconds = time.monotonic() - start
    return validation


async def _validate(row: SweRow, options: GradingOptions, swap: bool | None) -> Validation:
    from conveyor.tasks.swe import grading  # the grader runs the canaries: no import loop

    template = await run_in_pool("reward", grading.row_template, row)
    env = await run_in_pool("reward", grading.row_environment, row, options)
    metadata = await run_in_pool("reward", grading.row_metadata, row, options)
    workspace = await run_in_pool("reward", make_workspace, template, swe_home() / "workspaces")
    try:
        try:
            await run_in_pool("reward", apply_patch, workspace.path, row.patch)
            await run_in_pool("reward", apply_patch, workspace.path, row.test_patch)
        except PatchError as exc:
            return Validation([], 0, f"gold or test patch did not apply: {exc}")
        found = await run_in_pool("reward", candidates, row, workspace.path, CANDIDATES, swap)
        if not found:
            return Validation([], 0, "no test with an equality assertion on a literal")
        await run_in_pool("reward", insert_canaries, workspace.path, found)
        run = await grading.run_row_tests(
            row, workspace.path, env, options, selection(row, found), metadata
        )
    finally:
        await run_in_pool("reward", workspace.remove)
    renamed = any(c.runs_as for c in found)
    if not run.valid:
        why = run.violations[:1] or ["timed out"]
        return Validation([], len(found), f"the gold run was not valid: {why[0]}", renamed=renamed)
    listed = as_listed(run, found)
    broken = [t for t in [*row.FAIL_TO_PASS, *row.PASS_TO_PASS] if not listed.outcome(t).passed]
    if broken:
        why = [f"with the candidates present, gold does not pass {broken[:3]}"]
        return Validation([], len(found), why[0], renamed=renamed)
    kept = [c for c in found if _fails_as_it_must(run, c)]
    reason = None if kept else "no candidate failed under gold"
    return Validation(kept, len(found), reason)


def _fails_as_it_must(run: TestRun, canary: Canary) -> bool:
    outcome = run.outcome(canary.nodeid)
    return (
        outcome.outcome == "failed"
        and outcome.phase == "call"
        and (outcome.exc_type in (None, "AssertionError"))
    )


def _read(path: Path) -> Validation | None:
    try:
        record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        found = [Canary(**c) for c in record["canaries"]]
        return Validation(found, int(record["candidates"]), record.get("reason"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, validation: Validation) -> None:
    """Write atomically: a reader sees the whole record or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**asdict(validation), "generator": GENERATOR_VERSION}
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(record, out, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.asynccontextmanager
async def _locked(key: str) -> AsyncIterator[None]:
    """`environment.locked(key)` (the same lock file), taken without blocking the event loop:
    two rollouts of one row in one process must not wait on each other inside the loop."""
    folder = swe_home() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{safe_name(key)}.lock", "w") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(_LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
