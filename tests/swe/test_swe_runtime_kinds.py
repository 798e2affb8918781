"""`runtime.kind` for the swe family: bubblewrap by default, local and docker when named, and a
refusal at start for a kind it cannot use. The set-up and grading work runs on the named CPU
pools."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from tiny_project import tiny_row

from conveyor.agent.tools import ToolContext
from conveyor.config import RuntimeConfig
from conveyor.runtime import local as local_module
from conveyor.runtime.bubblewrap import BubblewrapRuntime, bubblewrap_available
from conveyor.runtime.docker import KEEPER, DockerRuntime
from conveyor.runtime.engine import engine_available
from conveyor.runtime.local import LocalRuntime
from conveyor.tasks.family import get_family
from conveyor.tasks.swe import family as family_module
from conveyor.tasks.swe import grading as grading_module
from conveyor.tasks.swe.family import SweFamily, SweRuntime, gold_edits
from conveyor.tasks.swe.grading import row_template
from crashed_workspace import orphan_workspace

AVAILABLE, WHY = bubblewrap_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=WHY)


def _swe(kind: str, **settings: Any) -> SweFamily:
    family = get_family("swe", RuntimeConfig(kind=kind, **settings))
    assert isinstance(family, SweFamily)
    return family


def test_swe_family_refuses_at_start_a_runtime_kind_it_cannot_use() -> None:
    with pytest.raises(ValueError, match=r"runtime\.kind 'simulated'.*bubblewrap, local, docker"):
        get_family("swe", RuntimeConfig(kind="simulated"))
    assert _swe("auto").runtime_kind == "bubblewrap"


@needs_sandbox
def test_swe_rollout_runs_in_bubblewrap_by_default() -> None:
    family = _swe("auto")
    task = family.task(tiny_row())

    async def rollout() -> tuple[object, str]:
        runtime = await family.make_runtime(task)
        try:
            assert isinstance(runtime, SweRuntime)
            # the sandbox user, not the host's root, runs the agent's commands
            result = await runtime.exec("id -u && pwd", 30)
            return runtime.inner, result.stdout
        finally:
            await runtime.close()

    inner, out = asyncio.run(rollout())
    assert isinstance(inner, BubblewrapRuntime)
    assert out.split() == ["65534", "/workspace"]


def _spy_threads(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, seen: list[str]) -> None:
    real = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)


@needs_sandbox  # the grader's test run is sandboxed whatever the rollout's runtime is
def test_swe_rollout_runs_in_the_local_runtime_and_cpu_work_runs_on_the_named_pools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local_module, "_warned", False)  # it warns once per process
    family = _swe("local")
    task = family.task(tiny_row())
    set_up: list[str] = []
    graded: list[str] = []
    _spy_threads(monkeypatch, family_module, "make_workspace", set_up)
    _spy_threads(monkeypatch, grading_module, "make_workspace", graded)

    async def rollout() -> tuple[float, str, Path]:
        runtime = await family.make_runtime(task)
        try:
            assert isinstance(runtime, SweRuntime) and isinstance(runtime.inner, LocalRuntime)
            ctx = ToolContext(task=task, runtime=runtime)
            tools = family.tools()
            # the local runtime shows the workspace at its host path, not at /workspace
            row = tiny_row()
            oracle = [*gold_edits(row, row_template(row), root=runtime.root)]
            oracle.append(family.oracle_calls(task)[-1])  # finish
            for call in oracle:
                outcome = await tools.execute(call, ctx, timeout_s=60, max_output_chars=4000)
                assert not outcome.is_error, outcome.output
            # plain subprocesses at the workspace's host path, with the test venv first
            result = await runtime.exec("pwd && python -m pytest -q tests", 60)
            score = await family.score(task, ctx.state.get("answer"), runtime)
            return score, result.stdout, runtime.workspace
        finally:
            await runtime.close()

    with pytest.warns(RuntimeWarning, match="does not isolate"):
        score, out, workspace = asyncio.run(rollout())
    assert score == 1.0
    assert out.splitlines()[0] == os.path.realpath(workspace)
    assert "4 passed" in out
    assert not workspace.exists()  # removed on close
    assert set_up and all(name.startswith("conveyor-init") for name in set_up)
    assert graded and all(name.startswith("conveyor-reward") for name in graded)


FAKE_DOCKER = r"""#!/usr/bin/env python3
# Test-only stand-in for the docker CLI: no docker engine exists here. It records every call
# and runs `exec`'d shell commands on the host in the container's mounted workspace.
import json, os, subprocess, sys
log = os.environ["FAKE_DOCKER_LOG"]
args = sys.argv[1:]
with open(log, "a") as f:
    f.write(json.dumps(args) + "\n")
if args[0] == "info":
    print("99.0-fake")
elif args[0] == "run":
    print("0123456789ab")
elif args[0] == "exec":
    calls = [json.loads(line) for line in open(log)]
    run = next(c for c in calls if c[0] == "run")
    mounts = [run[i + 1] for i, a in enumerate(run) if a == "--mount"]
    mount = next(m for m in mounts if "target=/workspace" in m)
    source = dict(part.split("=", 1) for part in mount.split(","))["source"]
    rest = [a for a in args[1:] if a != "-i"][1:]
    sys.exit(subprocess.run(rest, cwd=source).returncode)
"""


def test_swe_rollout_runs_in_docker_when_runtime_kind_is_docker__fake_docker_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    log = tmp_path / "docker.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    engine_available.cache_clear()  # an earlier answer came from another PATH
    family = _swe("docker", docker_image="python:3.11-slim", engine="docker")
    task = family.task(tiny_row())

    async def rollout() -> tuple[object, str, Path, int]:
        runtime = await family.make_runtime(task)
        try:
            assert isinstance(runtime, SweRuntime)
            result = await runtime.exec("echo hello from the container", 30)
            return runtime.inner, result.stdout, runtime.workspace, runtime.workspace.stat().st_uid
        finally:
            await runtime.close()

    try:
        inner, out, workspace, owner = asyncio.run(rollout())
    finally:
        engine_available.cache_clear()
    assert isinstance(inner, DockerRuntime)
    assert out == "hello from the container\n"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    run = next(c for c in calls if c[0] == "run")
    assert run[-4:] == ["python:3.11-slim", "sh", "-c", KEEPER]
    assert run[run.index("--network") + 1] == "none"
    mounts = [run[i + 1] for i, arg in enumerate(run) if arg == "--mount"]
    assert f"type=bind,source={workspace.resolve()},target=/workspace" in mounts
    env = grading_module.row_environment(tiny_row())
    assert f"type=bind,source={env.path.resolve()},target={env.path.resolve()},readonly" in mounts
    # commands run as the workspace's owner: the container has no capability to write others'
    assert run[run.index("--user") + 1].split(":")[0] == str(owner)
    variables = dict(run[i + 1].split("=", 1) for i, arg in enumerate(run) if arg == "--env")
    assert "/workspace" in variables["PYTHONPATH"].split(":")
    assert calls[-1][:2] == ["rm", "-f"]  # the container is removed on close ...
    assert not workspace.exists()  # ... and the workspace with it


@needs_sandbox
def test_the_first_rollout_sweeps_workspaces_a_crashed_process_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    template = row_template(tiny_row())
    root = family_module.swe_home() / "workspaces"
    orphan = orphan_workspace(template, root)
    monkeypatch.setattr(family_module, "_SWEPT_ROOTS", set())  # as in a new process
    family = _swe("auto")

    async def first_rollout() -> None:
        runtime = await family.make_runtime(family.task(tiny_row()))
        await runtime.close()

    asyncio.run(first_rollout())
    assert not orphan.exists()
