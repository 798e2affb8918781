"""The training-backend protocol: what the RL loop hands a trainer, and what it gets back.

A backend takes one batch of token-exact training samples, each with its trajectory's advantage
(see `conveyor.trainer.advantages.assign_to_samples`), makes exactly one optimizer update, and
hands its new weights to the sampling side (`sync_to`). The built-in `TorchTrainingEngine`
(`conveyor.trainer.engine`) implements it; the Tinker bridge implements the same methods. The
loop talks to a backend only through this protocol.

`trainer.backend` names a `conveyor.registry.BackendSpec` in `BACKENDS`: what a backend is
(`info`, for `conveyor backends`), which engines it can sync into (`refusal`), how to build it,
and what the app asks of it (its sampler, whether it exports a model folder, runs on a
cluster, can run the warm start). `register_backend` makes that spec from a `BackendMaker`.
Trainers that drive our rollouts instead (VeRL, SkyRL-train) are no backends: they are listed
as external drivers (`conveyor.bridges.drivers`).

This module imports no torch: `Tensor` appears in annotations only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel

from conveyor.registry import BACKENDS, BackendSpec, NoOptions
from conveyor.types import TrainingSample

if TYPE_CHECKING:
    from torch import Tensor

    from conveyor.config import ConveyorConfig, TrainerConfig
    from conveyor.engines.base import WeightFingerprint


@dataclass(frozen=True)
class TrainBatch:
    """One update's worth of data: training samples with their advantages.

    `items[i] = (sample, advantage)`: the advantage goes to every loss-masked token of the sample.
    `ref_logprobs[i]`, when given, are a reference policy's logprobs of `items[i]`'s tokens,
    aligned with its `input_ids` like `TrainingSample.logprobs` (the KL penalty needs them).
    """

    items: Sequence[tuple[TrainingSample, float]]
    ref_logprobs: Sequence[Sequence[float]] | None = None

    def __post_init__(self) -> None:
        for i, (sample, _) in enumerate(self.items):
            n = len(sample.input_ids)
            if len(sample.loss_mask) != n or len(sample.logprobs) != n:
                raise ValueError(
                    f"sample {i}: {n} input ids, {len(sample.loss_mask)} loss-mask entries and "
                    f"{len(sample.logprobs)} logprobs; they must be aligned"
                )
        if self.ref_logprobs is not None:
            if len(self.ref_logprobs) != len(self.items):
                raise ValueError(
                    f"{len(self.ref_logprobs)} reference logprob rows for {len(self.items)} samples"
                )
            for i, ((sample, _), ref) in enumerate(zip(self.items, self.ref_logprobs, strict=True)):
                if len(ref) != len(sample.input_ids):
                    raise ValueError(
                        f"sample {i}: {len(ref)} reference logprobs for "
                        f"{len(sample.input_ids)} input ids"
                    )

    @property
    def samples(self) -> list[TrainingSample]:
        """The samples, in order."""
        return [sample for sample, _ in self.items]

    @property
    def trained_tokens(self) -> int:
        """Tokens with loss mask 1 over the whole batch."""
        return sum(sum(1 for m in sample.loss_mask if m) for sample, _ in self.items)


@dataclass(frozen=True)
class StepResult:
    """What one update did, for `metrics.jsonl` and the console.

    - `loss`: the batch loss (the configured reduction over the whole batch, not one micro-batch).
    - `grad_norm`: the global L2 norm of the gradient before clipping.
    - `lr`: the learning rate this update used.
    - `tokens`: non-padding tokens forwarded; `trained_tokens`: tokens with loss mask 1 in the
      batch (forwarded or not).
    - `skipped_samples`: samples not forwarded because their gradient is exactly zero
      (advantage 0 and no KL term); they still count in the loss normalisation.
    - `tokens_per_s`: `tokens` over the wall time of the step.
    - `logprob_diff_mean` / `logprob_diff_max`: mean and max of |trainer logprob - behaviour
      logprob| over trained tokens, under the parameters that start the update. A broken weight
      sync or chat template shows up here at once (see `docs/algorithms.md`).
    - `probed_tokens`: the trained tokens those two numbers cover (the forwarded samples'):
      0 when every sample was skipped, and the two numbers then say nothing.
    - `policy_version`: the version after this update.
    - `metrics`: further loss diagnostics (`clip_fraction`, `approx_kl`, ...).
    """

    loss: float
    grad_norm: float
    lr: float
    tokens: int
    trained_tokens: int
    tokens_per_s: float
    logprob_diff_mean: float
    logprob_diff_max: float
    policy_version: int
    step_time_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    skipped_samples: int = 0
    probed_tokens: int = 0

    def as_dict(self, prefix: str = "train/") -> dict[str, float]:
        """Flat float metrics, names prefixed, for `metrics.jsonl`."""
        out = {
            f"{prefix}{name}": float(getattr(self, name))
            for name in (
                "loss",
                "grad_norm",
                "lr",
                "tokens",
                "trained_tokens",
                "tokens_per_s",
                "logprob_diff_mean",
                "logprob_diff_max",
                "probed_tokens",
                "policy_version",
                "skipped_samples",
                "step_time_s",
            )
        }
        out.update({f"{prefix}{name}": value for name, value in self.metrics.items()})
        return out


@runtime_checkable
class TrainingBackend(Protocol):
    """A trainer the RL loop can drive: one update per batch, weights out to the sampler."""

    @property
    def policy_version(self) -> int:
        """How many updates the current weights have had; starts at 0, +1 per `step`.

        Samplers stamp turns with the version they generated under, so the loop can measure
        staleness as this value minus a trajectory's oldest turn version.
        """
        ...

    def step(self, batch: TrainBatch) -> StepResult:
        """Make exactly one optimizer update from the whole batch and return its metrics.

        The loss over the batch is the same however the backend splits it into micro-batches
        or devices. Samples' `logprobs` are the behaviour (engine) logprobs; they feed the
        agreement probe and, where configured, truncated importance sampling.
        """
        ...

    def compute_logprobs(self, samples: Sequence[TrainingSample]) -> list[list[float]]:
        """The current policy's logprob of every token of each sample, aligned with `input_ids`.

        Position 0 has no predecessor and holds 0.0. No parameters change.
        """
        ...

    def export_weights(self) -> Iterable[tuple[str, Tensor]]:
        """Full (unsharded) weights under their Hugging Face names, LoRA merged when used.

        Exactly what a sampling engine's `update_weights` takes. Under several processes every
        rank must iterate it (gathering shards is collective). A backend whose weights live in
        a service may raise `NotImplementedError`; the loop only calls `sync_to`.
        """
        ...

    async def sync_to(self, engine: Any, *, step: int = 0) -> None:
        """Make `engine` serve this backend's current weights, tagged with `policy_version`.

        In-process tensors go through the engine's `update_weights`; weights that live in a
        service are saved there and the engine is pointed at them. `step` is the RL step the
        sync belongs to (the `weight_sync` fault-injection point). The caller checks the
        result with the weight fingerprint (`conveyor.trainer.weight_sync.checked_sync`).
        """
        ...

    def save(self, path: Path) -> None:
        """Write everything needed to continue training exactly into the folder `path`.

        Not atomic by itself: `conveyor.trainer.checkpoint.save_checkpoint` wraps it in a
        temporary folder and a rename.
        """
        ...

    def load(self, path: Path) -> None:
        """Restore the state written by `save`, so the next `step` is the one that followed."""
        ...


@runtime_checkable
class FingerprintedBackend(Protocol):
    """A backend that can say what an engine loaded with its `export_weights` must serve."""

    def weight_fingerprint(
        self, like: WeightFingerprint, probe_ids: Sequence[int]
    ) -> WeightFingerprint:
        """Digests of the exported tensors `like` names, in the dtypes `like` holds them in
        (names this backend does not export are left out), and the temperature-1 logprobs of
        every token of `probe_ids` (position 0: 0.0). See `conveyor.trainer.weight_sync`."""
        ...


class BackendUnavailable(RuntimeError):
    """A backend that cannot be built here (its package, virtual environment, service or GPU is
    missing); the message says which and how to get it."""


@dataclass(frozen=True)
class BackendInfo:
    """What `conveyor backends --json` says of one backend."""

    name: str
    version: str | None  # of the package behind it; None when it is not installed
    train: bool  # `conveyor train` can use it on this machine now
    eval: bool  # its sampling side can run `conveyor eval` on this machine now
    sync: str  # how new weights reach the sampler
    reason: str = ""  # why train or eval is not possible here; empty when both are

    def as_json(self) -> dict[str, Any]:
        """The JSON object of this backend."""
        return {
            "name": self.name,
            "version": self.version,
            "train": self.train,
            "eval": self.eval,
            "sync": self.sync,
            "usable": self.train,
            "reason": self.reason,
        }


@runtime_checkable
class BackendMaker(Protocol):
    """What a training backend's module provides; `register_backend` turns it into the
    `BackendSpec` that `trainer.backend` names."""

    def info(self) -> BackendInfo:
        """Its version, what it supports here, and why not where it does not; cheap, and
        never raises (a missing package is a reason, not an error)."""
        ...

    def refusal(self, config: ConveyorConfig, engine: Any) -> str | None:
        """Why this backend cannot sync weights into `engine` (one message naming the config
        keys to change), or None when it can."""
        ...

    def build(
        self, config: ConveyorConfig, model_dir: Path, settings: TrainerConfig
    ) -> TrainingBackend:
        """The backend, starting from the weights in `model_dir`, trained with `settings`;
        `BackendUnavailable` when it cannot run here."""
        ...


def register_backend(
    name: str,
    maker: BackendMaker,
    *,
    options: type[BaseModel] = NoOptions,
    sampler: str | None = None,
    exports_model: bool = False,
    distributed: bool = False,
    warm_start: bool = False,
    summary: str = "",
) -> BackendSpec:
    """Register `maker` as the training backend `name`, with what the app asks of it (see
    `conveyor.registry.BackendSpec`): `sampler`, the engine kind it brings (a config that
    leaves `engine.kind` unset samples with it, so changing `trainer.backend` alone moves the
    config); `exports_model`, `distributed`, `warm_start`. `options` is the model of
    `trainer.backend.options` (the backend reads them from `config.trainer.backend.options`)."""
    return BACKENDS.add(
        BackendSpec(
            name=name,
            build=maker.build,
            info=maker.info,
            refusal=maker.refusal,
            options=options,
            sampler=sampler,
            exports_model=exports_model,
            distributed=distributed,
            warm_start=warm_start,
            summary=summary,
        )
    )


def logprob_agreement(
    samples: Sequence[TrainingSample], trainer_logprobs: Sequence[Sequence[float]]
) -> dict[str, float]:
    """Mean and max |trainer logprob - behaviour logprob| over the trained tokens of `samples`,
    and how many tokens that was (`tokens`).

    The probe of issue 4 point 8: with `trainer_logprobs = backend.compute_logprobs(samples)`
    right after a weight sync, both numbers should be near 0 (numerics only); a wrong sync, chat
    template or temperature shows up as a large max at once. `TrainingBackend.step` reports the
    same numbers for every batch it trains on.
    """
    if len(samples) != len(trainer_logprobs):
        raise ValueError(f"{len(trainer_logprobs)} logprob rows for {len(samples)} samples")
    total, count, worst = 0.0, 0, 0.0
    for sample, row in zip(samples, trainer_logprobs, strict=True):
        if len(row) != len(sample.input_ids):
            raise ValueError(f"{len(row)} logprobs for {len(sample.input_ids)} tokens")
        for trained, behaviour, trainer in zip(sample.loss_mask, sample.logprobs, row, strict=True):
            if trained:
                diff = abs(trainer - behaviour)
                total += diff
                count += 1
                worst = max(worst, diff)
    return {"mean": total / count if count else 0.0, "max": worst, "tokens": float(count)}
