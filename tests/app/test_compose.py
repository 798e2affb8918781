"""Every built part is selectable from YAML: runtime.kind, dispatch.executor and engine.kind,
through the composition root that every command uses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.app.compose import Composition
from conveyor.config import ConfigError, load_config

SWE_LOCAL = """\
tasks:
  families: [swe]
  num_tasks: 1
runtime:
  kind: local
dispatch:
  reward_timeout_s: 1000
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def eval_run(config: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "conveyor.cli", "eval", str(config)]
    for item in overrides:
        args += ["--set", item]
    return subprocess.run(args, capture_output=True, text=True, timeout=900)


def test_runtime_kind_from_yaml_reaches_the_family(tmp_path: Path) -> None:
    parts = Composition(load_config(write(tmp_path, SWE_LOCAL)).config)
    assert parts.families["swe"].runtime_kind == "local"  # type: ignore[attr-defined]
    auto = Composition(load_config(write(tmp_path, SWE_LOCAL.replace("local", "auto"))).config)
    assert auto.families["swe"].runtime_kind == "bubblewrap"  # type: ignore[attr-defined]


def test_a_runtime_kind_a_family_cannot_use_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"runtime.kind \('local'\) cannot host the 'filenav'"):
        load_config(write(tmp_path, "tasks:\n  families: [filenav]\nruntime:\n  kind: local\n"))
    refused = eval_run(write(tmp_path, "runtime:\n  kind: docker\n  docker_image: x\n"))
    assert refused.returncode == 2 and "runtime.kind ('docker')" in refused.stderr


def test_executor_from_yaml_places_the_stages(tmp_path: Path) -> None:
    from conveyor.registry import EXECUTORS

    config = load_config(write(tmp_path, "dispatch:\n  executor: asyncio\n")).config
    assert config.dispatch.executor.name == "asyncio"
    with pytest.raises(ConfigError, match=r"unknown dispatch executor 'rya'.*did you mean 'ray'"):
        load_config(write(tmp_path, "dispatch:\n  executor: rya\n"))
    assert {"asyncio", "ray"} <= set(EXECUTORS.names())


@pytest.mark.slow
def test_an_eval_runs_on_the_ray_executor_named_in_yaml(tmp_path: Path, model_dir: Path) -> None:
    """`dispatch.executor: ray`: a local Ray starts and the rollouts' runtimes live in its
    actors; the simulated engine keeps the run short (the engine is not what is tested)."""
    pytest.importorskip("ray")
    config = write(
        tmp_path,
        "engine:\n  kind: simulated\ntasks:\n  families: [arithmetic]\n  num_tasks: 2\n"
        "  group_size: 1\ndispatch:\n  executor: ray\n",
    )
    done = eval_run(config, f"run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["overall"]["rollouts"] == 2
    assert "infra_error" not in summary["overall"]["statuses"]


@pytest.mark.slow
def test_an_eval_runs_on_the_hf_engine_named_in_yaml(tmp_path: Path, model_dir: Path) -> None:
    """`engine.kind: hf`: transformers' generate on the embedded model, one request at a time."""
    config = write(
        tmp_path,
        "engine:\n  kind: hf\nsampling:\n  temperature: 0.0\nagent:\n  max_turns: 2\n"
        "  max_completion_tokens: 48\ntasks:\n  families: [arithmetic]\n  num_tasks: 2\n"
        "  group_size: 1\n",
    )
    done = eval_run(config, f"run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["engine"] == "hf" and summary["overall"]["rollouts"] == 2
    assert "infra_error" not in summary["overall"]["statuses"]
    assert summary["overall"]["mean_completion_tokens"] > 0  # the model really generated
