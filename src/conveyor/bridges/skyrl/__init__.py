"""SkyRL-train, an external driver: it drives the loop, our dispatcher makes its rollouts.

SkyRL-train (`skyrl` on PyPI) trains on what its generator returns; `ConveyorGenerator`
(`generator.py`) is that generator, running each batch through our dispatcher. SkyRL needs
Python >= 3.12 and its FSDP backend a CUDA GPU, so on this machine (Python 3.11, no GPU) the
backend is listed, not buildable, and `check` (`conveyor bridge check --backend skyrl`) proves
the encoding against SkyRL's own validation (`bridge_check.py`). Importing this module never
imports SkyRL.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.bridges.skyrl.bridge_check import check, skyrl_python
from conveyor.bridges.skyrl.generator import (
    ConveyorGenerator,
    read_batch,
    skyrl_generator_class,
    to_generator_output,
)
from conveyor.bridges.skyrl.wheel import SKYRL_VERSION, cached_wheel
from conveyor.trainer.backend import BackendInfo, BackendUnavailable, TrainingBackend

if TYPE_CHECKING:
    from conveyor.config import ConveyorConfig, TrainerConfig

__all__ = [
    "ConveyorGenerator",
    "SkyrlSpec",
    "check",
    "read_batch",
    "skyrl_generator_class",
    "to_generator_output",
]

HOW_TO = (
    "SkyRL-train runs its own loop: it needs Python >= 3.12 and a CUDA GPU. Build its venv with "
    "`bash scripts/venv-skyrl.sh` (needs python3.12/3.13 or PYTHON312=/path/to/python3.12), "
    "install skyrl[fsdp]==0.4.0 there on a GPU machine, and hand SkyRL "
    "`conveyor.bridges.skyrl.skyrl_generator_class().from_composition(Composition(config))` as "
    "its generator; `conveyor bridge check --backend skyrl` checks the encoding here"
)
SYNC = (
    "SkyRL-train syncs its own inference engines; our engine is to sample from them over HTTP "
    "(engine.kind openai), untried"
)


def skyrl_version() -> str | None:
    """The installed skyrl's version, else the cached pinned wheel's, else None."""
    try:
        return version("skyrl")
    except PackageNotFoundError:
        pass
    if skyrl_python() is not None:
        return f"{SKYRL_VERSION} (.venv-skyrl)"
    wheel = cached_wheel()
    return f"{SKYRL_VERSION} (wheel)" if wheel is not None else None


class SkyrlSpec:
    """SkyRL-train as an external driver (`conveyor.bridges.drivers`): described and checked
    here, run by SkyRL itself."""

    def info(self) -> BackendInfo:
        """Neither train nor eval through `conveyor train`/`eval`: SkyRL's trainer is the
        entry point, and it needs Python >= 3.12 and a GPU."""
        return BackendInfo(
            name="skyrl",
            version=skyrl_version(),
            train=False,
            eval=False,
            sync=SYNC,
            reason=HOW_TO,
        )

    def refusal(self, config: ConveyorConfig, engine: Any) -> str | None:
        """Always refused: `conveyor train` never drives SkyRL-train."""
        return f"trainer.backend 'skyrl' cannot run under `conveyor train`. {HOW_TO}"

    def build(
        self, config: ConveyorConfig, model_dir: Path, settings: TrainerConfig
    ) -> TrainingBackend:
        """Never buildable here; the error says how SkyRL runs our rollouts instead."""
        raise BackendUnavailable(HOW_TO)
