"""`TinkerBackend`: the `TrainingBackend` whose weights live in the Tinker service.

One `step` is one `forward_backward` (the loss `plan_loss` maps our `trainer.loss` to) and one
`optim_step` with AdamW settings from `trainer`; both are submitted before either is waited
for, as the SDK intends. `sync_to` saves sampler weights in the service and points a
`TinkerSamplingClient` at them. Checkpoints hold only a tinker path (the state stays there).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from conveyor.bridges.tinker import datums as encoding
from conveyor.bridges.tinker.sampling import TinkerSamplingClient
from conveyor.config import TrainerConfig
from conveyor.engines.base import WeightFingerprint
from conveyor.trainer.backend import StepResult, TrainBatch, logprob_agreement
from conveyor.trainer.policy_losses import ppo_clip_settings
from conveyor.types import TrainingSample

if TYPE_CHECKING:
    from torch import Tensor

STATE_FILE = "tinker_state.json"


def adam_params(settings: TrainerConfig) -> Any:
    """`tinker.types.AdamParams` from `trainer.lr`, `betas`, `eps`, `weight_decay` and
    `max_grad_norm` (null: 0.0, Tinker's "no clipping")."""
    from tinker import types

    return types.AdamParams(
        learning_rate=settings.lr,
        beta1=settings.betas[0],
        beta2=settings.betas[1],
        eps=settings.eps,
        weight_decay=settings.weight_decay,
        grad_clip_norm=settings.max_grad_norm or 0.0,
    )


class TinkerBackend:
    """Trains a LoRA adapter in the Tinker service through `training_client` (a
    `tinker.TrainingClient`, or an object with its methods returning futures with `result()`).

    `name` prefixes the checkpoints it saves in the service.
    """

    def __init__(
        self, training_client: Any, settings: TrainerConfig, *, name: str = "conveyor"
    ) -> None:
        self._client = training_client
        self._settings = settings
        self._loss = ppo_clip_settings(settings.loss, "trainer.backend tinker")
        self._plan = encoding.plan_loss(self._loss)  # refuses unsupported keys at build
        self._name = name
        self._version = 0

    @property
    def policy_version(self) -> int:
        """Updates made so far (restored by `load`)."""
        return self._version

    @property
    def loss_plan(self) -> encoding.LossPlan:
        """The Tinker loss this backend runs, and why."""
        return self._plan

    def step(self, batch: TrainBatch) -> StepResult:
        """One `forward_backward` over the whole batch, then one `optim_step`."""
        start = time.perf_counter()
        plan, settings = self._plan, self._settings
        if not batch.items:
            raise ValueError("an empty batch cannot make an update")
        if self._loss.kl_coef and batch.ref_logprobs is None:
            raise ValueError("trainer.loss.kl_coef is set but the batch has no ref_logprobs")
        data = encoding.batch_datums(batch, self._loss, plan)
        if plan.loss_fn == "custom":
            loss_fn = encoding.custom_loss_fn(self._loss, batch.ref_logprobs)
            pending = self._client.forward_backward_custom(data, loss_fn)
        else:
            pending = self._client.forward_backward(data, plan.loss_fn, plan.loss_fn_config or None)
        optim = self._client.optim_step(adam_params(settings))
        output = pending.result()
        optim_metrics = optim.result().metrics or {}
        self._version += 1
        trainer_logprobs = [_aligned(out["logprobs"].to_numpy()) for out in output.loss_fn_outputs]
        agreement = logprob_agreement(batch.samples, trainer_logprobs)
        elapsed = time.perf_counter() - start
        tokens = sum(len(s.input_ids) for s in batch.samples)
        metrics = {f"tinker/{k}": float(v) for k, v in {**output.metrics, **optim_metrics}.items()}
        return StepResult(
            loss=float(output.metrics.get("loss:sum", float("nan"))),
            grad_norm=float(optim_metrics.get("grad_norm", float("nan"))),
            lr=settings.lr,
            tokens=tokens,
            trained_tokens=batch.trained_tokens,
            tokens_per_s=tokens / elapsed if elapsed > 0 else 0.0,
            logprob_diff_mean=agreement["mean"],
            logprob_diff_max=agreement["max"],
            probed_tokens=int(agreement["tokens"]),
            policy_version=self._version,
            step_time_s=elapsed,
            metrics=metrics,
        )

    def compute_logprobs(self, samples: Sequence[TrainingSample]) -> list[list[float]]:
        """The service's logprobs of every token of each sample (a `forward`, no update)."""
        if not samples:
            return []
        return [_aligned(row) for row in self._forward([list(s.input_ids) for s in samples])]

    def weight_fingerprint(
        self, like: WeightFingerprint, probe_ids: Sequence[int]
    ) -> WeightFingerprint:
        """The probe's logprobs under the trained weights; no digests (no tensor leaves the
        service), so `checked_sync` compares the function served, not bytes."""
        (row,) = self._forward([list(probe_ids)])
        return WeightFingerprint(policy_version=self._version, probe_logprobs=_aligned(row))

    def export_weights(self) -> Iterable[tuple[str, Tensor]]:
        """Not possible: the weights live in the Tinker service; the loop uses `sync_to`."""
        raise NotImplementedError(
            "trainer.backend tinker keeps its weights in the Tinker service; they reach the "
            "sampler through sync_to (save_weights_for_sampler), not as tensors"
        )

    async def sync_to(self, engine: Any, *, step: int = 0) -> None:
        """Save sampler weights in the service and point `engine` (a `TinkerSamplingClient`)
        at them, tagged with `policy_version`."""
        import asyncio

        if not isinstance(engine, TinkerSamplingClient):
            raise TypeError(
                f"trainer.backend tinker can only sync into engine.kind tinker, not "
                f"{type(engine).__name__}"
            )
        version = self._version

        def save() -> tuple[Any, str]:
            saved = self._client.save_weights_for_sampler(f"{self._name}-v{version}").result()
            return self._client.create_sampling_client(saved.path).result(), saved.path

        client, path = await asyncio.to_thread(save)
        engine.use_sampler(client, path, version)

    def save(self, path: Path) -> None:
        """Save the full training state (weights and optimizer) in the service and write its
        tinker path and our policy version to `path/tinker_state.json`."""
        saved = self._client.save_state(f"{self._name}-state-v{self._version}").result()
        path.mkdir(parents=True, exist_ok=True)
        state = {"tinker_path": saved.path, "policy_version": self._version}
        (path / STATE_FILE).write_text(json.dumps(state) + "\n")

    def load(self, path: Path) -> None:
        """Load the state `save` recorded in `path` (weights and optimizer)."""
        file = path / STATE_FILE
        if not file.is_file():
            raise FileNotFoundError(
                f"{file} is missing: not a checkpoint of trainer.backend tinker"
            )
        state = json.loads(file.read_text())
        self._client.load_state_with_optimizer(state["tinker_path"]).result()
        self._version = int(state["policy_version"])

    def _forward(self, sequences: Sequence[list[int]]) -> list[np.ndarray]:
        """Logprobs of each sequence's tokens 1.. under the current weights."""
        from tinker import types

        for ids in sequences:
            if len(ids) < 2:
                raise ValueError(f"a sequence needs at least two tokens, got {len(ids)}")
        data = [
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={
                    "target_tokens": types.TensorData.from_numpy(np.asarray(ids[1:], np.int64)),
                    "weights": types.TensorData.from_numpy(np.zeros(len(ids) - 1, np.float32)),
                },
            )
            for ids in sequences
        ]
        output = self._client.forward(data, "cross_entropy").result()
        return [out["logprobs"].to_numpy() for out in output.loss_fn_outputs]


def _aligned(target_logprobs: np.ndarray) -> list[float]:
    # the service scores targets ids[1:]; ours are aligned with input_ids, 0.0 at position 0
    return [0.0, *(float(x) for x in np.asarray(target_logprobs).reshape(-1))]
