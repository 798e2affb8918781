"""`trainer.backend` and `conveyor backends --json`: every registered backend is listed with its
version, what it supports here and how it syncs; a wrong name is refused with the known ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.app.compose import Composition
from conveyor.bridges.drivers import EXTERNAL_DRIVERS
from conveyor.config import ConfigError, ConveyorConfig, load_config
from conveyor.engines.simulated import SimulatedEngine
from conveyor.registry import BACKENDS


def test_backends_json_lists_every_registered_backend() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "backends", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    listed = {b["name"]: b for b in json.loads(done.stdout.strip().splitlines()[-1])["backends"]}
    assert set(listed) == set(BACKENDS.names()) | set(EXTERNAL_DRIVERS)
    assert {"builtin", "tinker"} <= set(BACKENDS.names())
    # VeRL and SkyRL-train drive our rollouts: listed and described, but no backend
    assert {"verl", "skyrl"} == set(EXTERNAL_DRIVERS) and not {"verl", "skyrl"} & set(
        BACKENDS.names()
    )
    builtin = listed["builtin"]
    assert builtin["train"] is True and builtin["eval"] is True
    assert builtin["version"].startswith("2.13")  # the torch it runs on
    for entry in listed.values():
        assert set(entry) >= {"name", "version", "train", "eval", "sync", "usable", "reason"}
        if not entry["train"]:
            assert entry["reason"], f"{entry['name']} is unusable without saying why"


def test_an_unknown_backend_is_refused_with_the_known_names(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  backend: tinkr\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert "tinkr" in message and "tinker" in message and "builtin" in message


def test_the_builtin_backend_refuses_an_engine_that_takes_no_weights() -> None:
    parts = Composition(ConveyorConfig())
    message = parts.backend_spec.refusal(parts.config, SimulatedEngine(eos_token_id=0))
    assert message is not None and "engine.kind" in message


def test_composition_builds_the_configured_backend(model_dir: Path) -> None:
    from conveyor.trainer.engine import TorchTrainingEngine

    parts = Composition(ConveyorConfig())
    backend = parts.trainer(model_dir)
    assert isinstance(backend, TorchTrainingEngine)
    assert backend.policy_version == 0


def test_trainer_backend_tinker_alone_moves_the_sampler_but_an_explicit_engine_kind_stays(
    tmp_path: Path,
) -> None:
    only_backend = tmp_path / "a.yaml"
    only_backend.write_text("trainer:\n  backend: tinker\n")
    assert Composition(load_config(only_backend).config).config.engine.kind == "tinker"
    explicit = tmp_path / "b.yaml"
    explicit.write_text("trainer:\n  backend: tinker\nengine:\n  kind: vllm\n")
    parts = Composition(load_config(explicit).config)
    assert parts.config.engine.kind == "vllm"  # kept, and then refused by the spec at start:
    refusal = parts.backend_spec.refusal(parts.config, SimulatedEngine(eos_token_id=0))
    assert refusal is not None and "engine.kind tinker" in refusal


def test_a_warm_start_with_a_service_backend_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "conveyor.cli", "train", "configs/filenav.yaml"),
            *("--set", "trainer.backend=tinker", "--set", f"run.dir={tmp_path / 'run'}"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2
    assert "rl.warm_start.steps=8 with trainer.backend 'tinker'" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("backend", ["verl", "skyrl"])
def test_an_external_driver_named_as_backend_is_refused_saying_what_it_is(
    backend: str, tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"trainer:\n  backend: {backend}\n")
    with pytest.raises(ConfigError, match=r"an external driver.*conveyor backends"):
        load_config(path)


@pytest.mark.parametrize("backend", ["tinker"])
def test_training_on_a_backend_unusable_here_is_refused_at_start_with_its_reason(
    backend: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "conveyor.cli", "train", "configs/filenav.yaml"),
            *("--set", f"trainer.backend={backend}", "--set", "rl.warm_start.steps=0"),
            *("--set", f"run.dir={tmp_path / 'run'}"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        env={k: v for k, v in os.environ.items() if k != "TINKER_API_KEY"},
    )
    assert done.returncode == 2, done.stderr
    assert f"trainer.backend {backend!r} cannot train here" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()
