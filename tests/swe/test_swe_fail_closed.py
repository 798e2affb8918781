"""The SWE grader fails closed and keeps its own files from the policy.

- A bubblewrap probe that fails (here a stand-in `bwrap` that fails as a real one does without
  user namespaces) makes grading raise `RuntimeFailure`: through the real dispatcher the
  rollout is retried and recorded as an infrastructure error with the reason, and the graded
  library code never runs outside the sandbox (a marker it writes to a host path that only an
  unsandboxed run can reach never appears). A failed probe is not remembered for good: once
  bubblewrap works again, grading does too.
- The grader's plugin and bootstrap, and its private run folders, are not visible in the
  policy's sandbox, while grading still works.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_project import CALC, buggy_calc, tiny_row

from conveyor.agent.tools import ToolContext
from conveyor.config import RuntimeConfig, load_config
from conveyor.runtime import bubblewrap
from conveyor.runtime.base import RuntimeFailure
from conveyor.runtime.bubblewrap import bubblewrap_available
from conveyor.tasks.family import get_family
from conveyor.tasks.swe.dataset import SweRow, write_rows
from conveyor.tasks.swe.environment import swe_home
from conveyor.tasks.swe.family import SweFamily
from conveyor.tasks.swe.grading import GradingOptions, grade, row_environment
from conveyor.tasks.swe.patches import file_diff
from conveyor.types import Status, ToolCall, Trajectory

AVAILABLE, WHY = bubblewrap_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=WHY)

FAILING_BWRAP = """#!/bin/sh
# Test-only stand-in for bwrap: fails the way bwrap does where it cannot make namespaces.
echo "bwrap: No permissions to creating new namespace (stand-in)" >&2
exit 1
"""


def _marker_row(marker: Path) -> SweRow:
    """The tiny row whose gold patch also writes `marker` (a host path outside every sandbox)
    when the library is imported: it appears only if the graded code runs unsandboxed."""
    writes = CALC + (
        f"\n\ntry:\n    open({str(marker)!r}, 'w').write('ran unsandboxed')\n"
        "except OSError:\n    pass\n"
    )
    row = tiny_row("tinycalc__marker")
    return row.model_copy(update={"patch": file_diff("tinycalc/__init__.py", buggy_calc(), writes)})


@pytest.fixture
def failing_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """PATH with the failing stand-in `bwrap` first, and no answer of an earlier probe kept
    (as in a fresh process); the real PATH and a fresh probe come back afterwards."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "bwrap").write_text(FAILING_BWRAP)
    (bin_dir / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    bubblewrap_available.cache_clear()
    yield bin_dir
    monkeypatch.undo()
    bubblewrap_available.cache_clear()


@needs_sandbox
def test_grading_raises_runtime_failure_when_the_probe_fails__fake_bwrap(
    failing_bwrap: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "marker"
    row = _marker_row(marker)
    with pytest.raises(RuntimeFailure, match=r"stand-in.*grading never runs unsandboxed"):
        asyncio.run(grade(row, row.patch))
    assert not marker.exists()
    # Within the back-off the failure is answered without a new probe; after it, a probe that
    # works again is believed (and kept).
    monkeypatch.setenv("PATH", os.environ["PATH"].split(":", 1)[1])
    monkeypatch.setattr(bubblewrap, "PROBE_RETRY_AFTER_S", 1e9)
    assert not bubblewrap_available()[0]
    monkeypatch.setattr(bubblewrap, "PROBE_RETRY_AFTER_S", 0.0)
    assert bubblewrap_available() == (True, "bubblewrap works")
    report = asyncio.run(grade(row, row.patch))
    assert report.resolved and not marker.exists()


@needs_sandbox
def test_the_policy_s_auto_runtime_stays_bubblewrap_when_the_probe_fails__fake_bwrap(
    failing_bwrap: Path,
) -> None:
    """`runtime.kind: auto` is bubblewrap for swe whatever the probe says: a rollout whose
    sandbox cannot start fails its init (`RuntimeFailure`, an infra error), never runs local."""
    family = get_family("swe", RuntimeConfig(kind="auto"))
    assert isinstance(family, SweFamily) and family.runtime_kind == "bubblewrap"
    with pytest.raises(RuntimeFailure, match=r"bubblewrap is not usable here.*stand-in"):
        asyncio.run(family.make_runtime(family.task(tiny_row())))


@needs_sandbox
@pytest.mark.filterwarnings("ignore:LocalRuntime does not isolate")
def test_the_marker_appears_when_grading_is_unsandboxed_on_purpose(tmp_path: Path) -> None:
    """The control: the marker is a real witness. Unsandboxed grading (its loud key) writes it;
    and without the key, `local` is refused."""
    marker = tmp_path / "marker"
    row = _marker_row(marker)
    trusted = GradingOptions(runtime="local", unsandboxed_grading_i_trust_the_policy=True)
    assert asyncio.run(grade(row, row.patch, trusted)).resolved
    assert marker.read_text() == "ran unsandboxed"
    with pytest.raises(ValueError, match="unsandboxed_grading_i_trust_the_policy: true"):
        GradingOptions(runtime="local")
    with pytest.raises(ValueError, match="does nothing unless runtime is 'local'"):
        GradingOptions(unsandboxed_grading_i_trust_the_policy=True)


async def _dispatch(config_overrides: list[str], row: SweRow) -> list[Trajectory]:
    """One oracle rollout of `row` through the real composition, stages and dispatcher (the
    path of `conveyor eval`), the policy scripted by `OracleEngine`."""
    from conveyor.app.compose import Composition
    from conveyor.trainer.sft import OracleEngine

    parts = Composition(load_config(None, config_overrides).config)
    try:
        family = parts.families["swe"]
        task = family.task(row)
        tokenizer = parts.tokenizer
        engine = OracleEngine(
            {task.id: family.oracle_calls(task)},
            lambda text: tokenizer.encode(text, add_special_tokens=False),
            tokenizer.eos_token_id,
            parts.config.model.tool_format,
        )
        dispatcher = parts.dispatcher(parts.stages(engine=engine))
        return [t async for t in dispatcher.rollouts([task], 1)]
    finally:
        await parts.close()


@needs_sandbox
@pytest.mark.filterwarnings("ignore:LocalRuntime does not isolate")
def test_a_failed_probe_makes_dispatched_rollouts_infra_errors_retried__fake_bwrap(
    failing_bwrap: Path, tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy works in the local runtime; the grader's sandbox, which the row's canary
    validation (in init) and its grading (in reward) need, cannot start: retried once, then an
    infra error that says why, and the graded code never ran."""
    # A marker path no earlier run used: the row (its patch names the marker) then has no cached
    # canary validation under ~/.cache, which a recycled pytest tmp path once matched (CI found
    # init passing from that cache and only the reward stage failing).
    marker = tmp_path / f"marker-{uuid.uuid4().hex}"
    row = _marker_row(marker)
    write_rows(tmp_path / "rows.jsonl", [row])
    overrides = [
        "engine.kind=simulated",
        "tasks.families=[swe]",
        f"tasks.options={{swe: {{rows: [{tmp_path / 'rows.jsonl'}], "
        "grading: {run_timeout_s: 120}}}",
        "runtime.kind=local",
        "dispatch.reward_timeout_s=300",
        "dispatch.max_infra_retries=1",
        "agent.hints.enabled=false",
        "agent.max_turns=8",
        f"run.dir={tmp_path / 'run'}",
    ]
    (record,) = asyncio.run(_dispatch(overrides, row))
    assert isinstance(record, Trajectory)
    assert record.status is Status.INFRA_ERROR
    assert record.counters["infra_retries"] == 1  # tried twice, counted
    assert "init stage: RuntimeFailure" in (record.error or "")
    assert "grading never runs unsandboxed" in (record.error or "")
    assert not marker.exists()
    # bubblewrap works again: the next rollout (the policy sandboxed too, as by default; the
    # oracle's edits name /workspace) is graded, in the sandbox
    monkeypatch.setenv("PATH", os.environ["PATH"].split(":", 1)[1])
    monkeypatch.setattr(bubblewrap, "PROBE_RETRY_AFTER_S", 0.0)
    overrides[overrides.index("runtime.kind=local")] = "runtime.kind=bubblewrap"
    (again,) = asyncio.run(_dispatch(overrides, row))
    assert again.status is Status.OK and again.reward == 1.0
    assert again.counters["infra_retries"] == 0
    assert not marker.exists()


@needs_sandbox
def test_the_policy_sandbox_cannot_read_the_grader_s_files() -> None:
    family = get_family("swe", RuntimeConfig(kind="bubblewrap"))
    assert isinstance(family, SweFamily)
    row = tiny_row()
    env = row_environment(row)
    grader = env.plugin_dir
    # The grader's files exist on the host, outside the venv the policy's sandbox mounts, and
    # its private run folders live beside them.
    assert env.bootstrap.is_file() and (grader / "conveyor_outcomes.py").is_file()
    assert not env.bootstrap.is_relative_to(env.path)
    assert not list(env.path.rglob("conveyor_*.py"))
    assert asyncio.run(grade(row, row.patch)).resolved  # leaves <home>/grades behind
    assert (swe_home() / "grades").is_dir()
    task = family.task(row)

    async def look() -> dict[str, tuple[bool, str]]:
        runtime = await family.make_runtime(task)
        try:
            ctx = ToolContext(task=task, runtime=runtime)
            tools = family.tools()
            commands = {
                "bootstrap": f"cat {env.bootstrap}",
                "plugin": f"cat {grader / 'conveyor_outcomes.py'}",
                "grader": f"ls {grader.parent}",
                "grades": f"ls {swe_home() / 'grades'}",
                "anywhere": "find / \\( -path /proc -o -path /sys \\) -prune -o "
                "-name 'conveyor_*.py' -print 2>/dev/null; true",
                "venv": f"ls {env.path}",
            }
            seen = {}
            for name, command in commands.items():
                call = ToolCall(name="bash", arguments={"command": command})
                outcome = await tools.execute(call, ctx, timeout_s=60, max_output_chars=4000)
                seen[name] = (outcome.is_error, outcome.output)
            return seen
        finally:
            await runtime.close()

    seen = asyncio.run(look())
    for name in ("bootstrap", "plugin", "grader", "grades"):
        assert "No such file or directory" in seen[name][1], (name, seen[name])
    assert "conveyor_" not in seen["anywhere"][1], seen["anywhere"]
    assert "pyvenv.cfg" in seen["venv"][1]  # the sandbox does see the test venv
    # ... and grading from scratch still tells gold from empty
    assert asyncio.run(grade(row, row.patch)).reward == 1.0
    assert asyncio.run(grade(row, "")).reward == 0.0
