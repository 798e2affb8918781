"""A training backend added from outside the package: the built-in trainer, counting updates.

`trainer.backend: {name: counting, options: {log: PATH}}` trains with the built-in PyTorch
trainer and appends one line per update to PATH. One file: an options model, a `BackendMaker`
(info, refusal, build) and `register_backend` with what the app asks of it (it exports a model
folder and can run the warm start, like the trainer it wraps).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from conveyor.config import ConveyorConfig, TrainerConfig
from conveyor.registry import BACKENDS
from conveyor.trainer.backend import (
    BackendInfo,
    StepResult,
    TrainBatch,
    TrainingBackend,
    register_backend,
)
from conveyor.types import TrainingSample


class CountingOptions(BaseModel):
    """`trainer.backend.options` of `counting`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    log: str = Field(description="File that gets one line per update.")


class Counting:
    """The built-in trainer with every `step` recorded in the log; everything else is its."""

    def __init__(self, inner: TrainingBackend, log: Path) -> None:
        self._inner = inner
        self._log = log
        self.updates = 0

    def step(self, batch: TrainBatch) -> StepResult:
        """The built-in update, then a line naming it."""
        result = self._inner.step(batch)
        self.updates += 1
        with self._log.open("a") as sink:
            sink.write(f"backend counting update {self.updates} samples={len(batch.items)}\n")
        return result

    @property
    def policy_version(self) -> int:
        return self._inner.policy_version

    def compute_logprobs(self, samples: Sequence[TrainingSample]) -> list[list[float]]:
        return self._inner.compute_logprobs(samples)

    def export_weights(self) -> Iterable[tuple[str, Any]]:
        return self._inner.export_weights()

    async def sync_to(self, engine: Any, *, step: int = 0) -> None:
        await self._inner.sync_to(engine, step=step)

    def save(self, path: Path) -> None:
        self._inner.save(path)

    def load(self, path: Path) -> None:
        self._inner.load(path)

    def __getattr__(self, name: str) -> Any:
        # the rest of the built-in trainer (weight fingerprints, model export) as it is
        return getattr(self._inner, name)


class CountingMaker:
    """Described, checked and built like the built-in trainer it wraps."""

    def info(self) -> BackendInfo:
        builtin = BACKENDS.spec("builtin").info()
        return BackendInfo(
            name="counting",
            version=builtin.version,
            train=builtin.train,
            eval=builtin.eval,
            sync=builtin.sync,
            reason=builtin.reason,
        )

    def refusal(self, config: ConveyorConfig, engine: Any) -> str | None:
        refusal: str | None = BACKENDS.spec("builtin").refusal(config, engine)
        return refusal

    def build(
        self, config: ConveyorConfig, model_dir: Path, settings: TrainerConfig
    ) -> TrainingBackend:
        options = config.trainer.backend.options
        assert isinstance(options, CountingOptions)  # checked by this model when config loaded
        inner = BACKENDS.spec("builtin").build(config, model_dir, settings)
        return Counting(inner, Path(options.log))


register_backend(
    "counting", CountingMaker(), options=CountingOptions, exports_model=True, warm_start=True
)
