"""Our training samples as Tinker `Datum`s, and which Tinker loss reproduces our policy loss.

A sample of n ids becomes `Datum(model_input=ids[:-1], loss_fn_inputs={target_tokens: ids[1:],
logprobs, advantages})`: position i of the datum predicts token i + 1, so every per-token field
is our sample's field from position 1 on. Tinker's built-in losses *sum* over tokens and datums;
`token_scales` gives each token the factor that makes that sum our `trainer.loss.reduction`,
folded into its advantage (the losses are positively homogeneous in the advantage).

In Tinker's losses the ratio is taken against the `logprobs` the datum carries, the behaviour
(sampler) logprobs; so here `old_logprobs` of `conveyor.trainer.losses.policy_loss` are the
behaviour logprobs. The built-in trainer takes them from its own forward pass at the start of
the update instead; the two agree when sampler and trainer agree (`logprob_diff_*` near 0).
The mapping is in `docs/bridges.md`, "Tinker".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from conveyor.config.training import LossConfig
from conveyor.trainer.backend import TrainBatch
from conveyor.types import TrainingSample

if TYPE_CHECKING:
    from torch import Tensor

TinkerLoss = Literal["importance_sampling", "ppo", "custom"]


class TinkerLossUnsupported(ValueError):
    """A `trainer.loss` setting Tinker cannot reproduce; the message names the key."""


@dataclass(frozen=True)
class LossPlan:
    """Which Tinker loss runs our configured loss, with its `loss_fn_config`, and why."""

    loss_fn: TinkerLoss
    loss_fn_config: dict[str, float] = field(default_factory=dict)
    reason: str = ""


def plan_loss(settings: LossConfig) -> LossPlan:
    """The Tinker loss whose math is `policy_loss` under `settings` (old = behaviour).

    - `tis`: refused. The ratio is already taken against the behaviour logprobs, so the TIS
      weight `exp(old - behaviour)` would be 1: the key would silently do nothing.
    - `dual_clip_c` or `kl_coef`: no built-in loss has them, so `forward_backward_custom` runs
      our own `policy_loss` on the logprobs the service returns (one extra forward pass).
    - clipping that can never bind (`clip_low >= 1`, `clip_high` infinite): `importance_sampling`.
    - otherwise `ppo` with the clip thresholds `1 - clip_low`, `1 + clip_high`.
    """
    if settings.tis:
        raise TinkerLossUnsupported(
            "trainer.loss.tis is not supported with trainer.backend tinker: Tinker's ratio is "
            "already taken against the behaviour logprobs (clipped importance sampling), so the "
            "TIS weight would always be 1; set trainer.loss.tis: false"
        )
    if settings.dual_clip_c is not None or settings.kl_coef != 0.0:
        keys = [
            key
            for key, used in (
                ("dual_clip_c", settings.dual_clip_c is not None),
                ("kl_coef", settings.kl_coef != 0.0),
            )
            if used
        ]
        return LossPlan(
            "custom",
            reason=f"trainer.loss.{' and '.join(keys)}: no Tinker built-in loss has it; our "
            "policy_loss runs client-side through forward_backward_custom",
        )
    if settings.clip_low >= 1.0 and math.isinf(settings.clip_high):
        return LossPlan("importance_sampling", reason="the clip range never binds")
    return LossPlan(
        "ppo",
        {
            "clip_low_threshold": 1.0 - settings.clip_low,
            "clip_high_threshold": 1.0 + settings.clip_high,
        },
        reason="PPO clip without dual clip, KL or TIS",
    )


def norm_length(samples: Sequence[TrainingSample], settings: LossConfig) -> int:
    """The divisor of `seq_mean_token_sum_norm`: `norm_len`, or the longest sample (what
    `policy_loss` sees as T when the batch is padded to its longest sequence)."""
    if settings.norm_len is not None:
        return settings.norm_len
    return max((len(s.input_ids) for s in samples), default=1)


def token_scales(samples: Sequence[TrainingSample], settings: LossConfig) -> list[float]:
    """Per sample, the factor on each of its trained tokens that turns a plain sum over the
    batch into `settings.reduction` (`conveyor.trainer.losses.reduce_tokens`)."""
    counts = [sum(1 for m in s.loss_mask if m) for s in samples]
    if settings.reduction == "token_mean":
        total = max(sum(counts), 1)
        return [1.0 / total for _ in samples]
    if settings.reduction == "seq_mean_token_mean":
        with_tokens = max(sum(1 for c in counts if c), 1)
        return [1.0 / (with_tokens * c) if c else 0.0 for c in counts]
    length = norm_length(samples, settings)
    return [1.0 / (max(len(samples), 1) * length) for _ in samples]


def to_datum(
    sample: TrainingSample, advantage: float, scale: float, *, with_mask: bool = False
) -> Any:
    """One sample as a `tinker.types.Datum` (float32 logprobs/advantages, int64 targets).

    The advantage, times `scale`, goes on every trained token and 0 elsewhere. `with_mask`
    adds the loss mask as `weights` (what a custom loss needs to count tokens).
    """
    from tinker import types

    ids = sample.input_ids
    if len(ids) < 2:
        raise ValueError(f"a sample needs at least two tokens to predict one, got {len(ids)}")
    mask = np.asarray(sample.loss_mask[1:], dtype=bool)
    advantages = np.where(mask, np.float32(advantage * scale), np.float32(0.0)).astype(np.float32)
    inputs: dict[str, Any] = {
        "target_tokens": types.TensorData.from_numpy(np.asarray(ids[1:], dtype=np.int64)),
        "logprobs": types.TensorData.from_numpy(np.asarray(sample.logprobs[1:], dtype=np.float32)),
        "advantages": types.TensorData.from_numpy(advantages),
    }
    if with_mask:
        inputs["weights"] = types.TensorData.from_numpy(mask.astype(np.float32))
    return types.Datum(
        model_input=types.ModelInput.from_ints(list(ids[:-1])), loss_fn_inputs=inputs
    )


def batch_datums(batch: TrainBatch, settings: LossConfig, plan: LossPlan) -> list[Any]:
    """The batch as datums for `plan`: scaled advantages for a built-in loss; unscaled ones and
    the mask for a custom loss, which applies our reduction itself."""
    samples = batch.samples
    if plan.loss_fn == "custom":
        return [to_datum(s, a, 1.0, with_mask=True) for s, a in batch.items]
    scales = token_scales(samples, settings)
    return [to_datum(s, a, k) for (s, a), k in zip(batch.items, scales, strict=True)]


def builtin_loss_terms(
    plan: LossPlan, targets_logprobs: Sequence[np.ndarray], datums: Sequence[Any]
) -> list[np.ndarray]:
    """Per datum, the per-token terms of Tinker's built-in loss (their sum is the loss) when
    the policy gives `targets_logprobs[i]` to datum i's targets, as Tinker documents it."""
    out = []
    for datum, current in zip(datums, targets_logprobs, strict=True):
        sampling = datum.loss_fn_inputs["logprobs"].to_numpy().astype(np.float64)
        advantages = datum.loss_fn_inputs["advantages"].to_numpy().astype(np.float64)
        ratio = np.exp(np.asarray(current, dtype=np.float64) - sampling)
        if plan.loss_fn == "importance_sampling":
            out.append(-(ratio * advantages))
        elif plan.loss_fn == "ppo":
            low = plan.loss_fn_config["clip_low_threshold"]
            high = plan.loss_fn_config["clip_high_threshold"]
            clipped = np.clip(ratio, low, high)
            out.append(-np.minimum(ratio * advantages, clipped * advantages))
        else:
            raise ValueError(f"{plan.loss_fn!r} is not a built-in Tinker loss")
    return out


def custom_loss_fn(
    settings: LossConfig, ref_logprobs: Sequence[Sequence[float]] | None = None
) -> Any:
    """The `forward_backward_custom` loss: our `policy_loss` over the batch padded to its
    longest sample, aligned with `input_ids` (position 0 holds nothing), old = behaviour."""

    def loss(
        data: Sequence[Any], logprobs_list: Sequence[Tensor]
    ) -> tuple[Tensor, dict[str, float]]:
        return padded_policy_loss(data, logprobs_list, settings, ref_logprobs)

    return loss


def padded_policy_loss(
    data: Sequence[Any],
    logprobs_list: Sequence[Tensor],
    settings: LossConfig,
    ref_logprobs: Sequence[Sequence[float]] | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """`policy_loss` of custom-loss datums (with `weights` = loss mask) given the current
    logprobs of their targets; gradients flow into `logprobs_list`."""
    import torch

    from conveyor.trainer.losses import policy_loss

    if not logprobs_list:
        raise ValueError("a custom loss needs at least one datum")
    width = max(len(lp) for lp in logprobs_list) + 1
    rows = len(data)
    # the dtype of the logprobs the service returned (float32), or float64 in the bridge check
    dtype = torch.promote_types(logprobs_list[0].dtype, torch.float32)
    old = torch.zeros(rows, width, dtype=dtype)
    adv = torch.zeros(rows, width, dtype=dtype)
    mask = torch.zeros(rows, width, dtype=torch.bool)
    ref = torch.zeros(rows, width, dtype=dtype) if ref_logprobs is not None else None
    pieces = []
    for i, (datum, lp) in enumerate(zip(data, logprobs_list, strict=True)):
        n = len(lp)
        fields = datum.loss_fn_inputs
        old[i, 1 : n + 1] = fields["logprobs"].to_torch().to(dtype)
        adv[i, 1 : n + 1] = fields["advantages"].to_torch().to(dtype)
        mask[i, 1 : n + 1] = fields["weights"].to_torch() > 0
        if ref is not None and ref_logprobs is not None:
            ref[i, : n + 1] = torch.tensor(ref_logprobs[i], dtype=dtype)
        pieces.append(torch.nn.functional.pad(lp.to(dtype).reshape(1, -1), (1, width - n - 1)))
    current = torch.cat(pieces, dim=0)
    return policy_loss(current, old, adv, mask, settings, ref_logprobs=ref)
