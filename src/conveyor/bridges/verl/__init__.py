"""The VeRL bridge: VeRL's trainer drives our rollouts (an external driver, not a backend).

VeRL (`verl==0.9.1`) owns the training loop, the FSDP workers and the rollout servers; we give it
an agent loop (`conveyor.bridges.verl.agent_loop`, registered as `conveyor`) and a dataset of our
tasks (`conveyor bridge export-dataset`, `conveyor.bridges.verl.dataset`). VeRL pins
transformers < 5.11 and tensordict <= 0.10, so it lives in its own `.venv-verl`
(scripts/venv-verl.sh); this module imports no VeRL and works in the main venv.

`check` proves the encoding: it runs VeRL's own agent-loop post-processing on our trajectories
inside `.venv-verl` (`conveyor.bridges.verl.check_main`). How to train: docs/bridges-verl.md.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import conveyor
from conveyor.bridges.report import BridgeUnavailable, CheckReport
from conveyor.trainer.backend import BackendInfo, BackendUnavailable, TrainingBackend

if TYPE_CHECKING:
    from conveyor.config import ConveyorConfig, TrainerConfig

# Where the VeRL venv is: CONVEYOR_VERL_VENV, else `.venv-verl` at the repository root.
VENV_ENV = "CONVEYOR_VERL_VENV"
BUILD_HINT = "build it with `bash scripts/venv-verl.sh` (1.5 to 3.5 minutes, 1.7 GB)"
SYNC = "VeRL's own (FSDP -> vLLM/SGLang in its workers)"
HOW_TO_RUN = (
    "VeRL's trainer drives our rollouts, not `conveyor train`: write the dataset with "
    "`conveyor bridge export-dataset --config CONFIG --out train.parquet`, then run "
    "`python -m verl.trainer.main_ppo` in .venv-verl on a CUDA machine with "
    "data.train_files=train.parquet actor_rollout_ref.rollout.mode=async "
    "actor_rollout_ref.rollout.agent.agent_loop_config_path=<a YAML naming "
    "conveyor.bridges.verl.agent_loop.ConveyorAgentLoop as `conveyor`> "
    "(docs/bridges-verl.md has the whole command)"
)
_SRC = Path(conveyor.__file__).resolve().parents[1]


def venv_dir() -> Path:
    """The VeRL venv's folder (it may not exist)."""
    override = os.environ.get(VENV_ENV)
    return Path(override) if override else _SRC.parent / ".venv-verl"


def venv_python() -> Path | None:
    """The VeRL venv's interpreter, or None when the venv is not built."""
    python = venv_dir() / "bin" / "python"
    return python if python.is_file() else None


def installed_version() -> str | None:
    """The verl version installed in the VeRL venv (read from its metadata, no import)."""
    venv = venv_dir()
    for meta in sorted(venv.glob("lib/python*/site-packages/verl-*.dist-info/METADATA")):
        for line in meta.read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


class VerlSpec:
    """VeRL as an external driver (`conveyor.bridges.drivers`): what `conveyor backends` says
    of it; `build` and `refusal` say how to run it instead."""

    def info(self) -> BackendInfo:
        """Version in `.venv-verl` (None when not built); never trainable by `conveyor train`."""
        found = installed_version()
        reason = "needs a CUDA GPU; VeRL's trainer drives our rollouts (docs/bridges-verl.md)"
        if found is None:
            reason += f"; .venv-verl is missing: {BUILD_HINT}"
        return BackendInfo(
            name="verl", version=found, train=False, eval=False, sync=SYNC, reason=reason
        )

    def refusal(self, config: ConveyorConfig, engine: Any) -> str | None:
        """Every engine: the weights live in VeRL's workers, which our loop never drives."""
        return f"trainer.backend 'verl' is not driven by `conveyor train`: {HOW_TO_RUN}"

    def build(
        self, config: ConveyorConfig, model_dir: Path, settings: TrainerConfig
    ) -> TrainingBackend:
        """Always refuses, saying how to run VeRL with our agent loop."""
        raise BackendUnavailable(HOW_TO_RUN)


def check(trajectories: Path, *, model: str | None = None) -> CheckReport:
    """Run VeRL's own post-processing on `trajectories` in `.venv-verl` and check the DataProto
    against our samples (`conveyor.bridges.verl.check_main`). `model`: the tokenizer's folder
    (default: the embedded model). `BridgeUnavailable` when the venv is not built."""
    python = venv_python()
    if python is None:
        raise BridgeUnavailable(f"no VeRL venv at {venv_dir()}; {BUILD_HINT}")
    command = [str(python), "-m", "conveyor.bridges.verl.check_main", str(trajectories)]
    if model is not None:
        command += ["--model", model]
    # Our sources first, so the venv checks this checkout whatever its editable install names.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_SRC), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"the VeRL check failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}"
        )
    return CheckReport.from_json(json.loads(lines[-1]))
