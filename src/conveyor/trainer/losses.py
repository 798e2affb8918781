"""The policy-gradient loss: PPO-clip with dual clip, three reductions, TIS and a KL penalty.

It is the built-in loss `ppo_clip` (registered in `conveyor.trainer.policy_losses`, which imports
no torch); `reduce_tokens` and `token_mean` serve a loss of one's own too.

All per-token tensors are [B, T] and aligned with the input ids: position t holds the logprob of
token t (see `sequence_logprobs`), and `loss_mask` is 1 exactly where a token was sampled by the
policy. Masked positions are replaced by zeros before any arithmetic, so padding logprobs such as
-inf never turn into NaN, and the gradient there is exactly 0.0 for every reduction. The math is
in `docs/algorithms.md`.
"""

from __future__ import annotations

from typing import get_args

import torch
from torch import Tensor

from conveyor.config.training import KLEstimatorName as KLEstimator
from conveyor.config.training import LossConfig
from conveyor.config.training import LossReduction as Reduction


def sequence_logprobs(logits: Tensor, input_ids: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Logprob of each token under the logits of the position before it, aligned with `input_ids`.

    `logits` [B, T, V] are the model outputs for `input_ids` [B, T]; `out[:, t]` is
    `log softmax(logits[:, t - 1] / temperature)[input_ids[:, t]]` and `out[:, 0]` is 0 (no
    position predicts the first token). Computed in at least float32; divide by the sampling
    temperature so the result matches the engine's logprobs.
    """
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be [B, T, V] for input_ids "
            f"{tuple(input_ids.shape)} [B, T]"
        )
    # half-precision logits are upcast; float64 stays float64
    dtype = torch.promote_types(logits.dtype, torch.float32)
    scaled = logits[:, :-1].to(dtype) / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    # gather minus logsumexp equals log_softmax + gather without a second [B, T, V] tensor
    next_token = scaled.gather(-1, targets).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    return torch.nn.functional.pad(next_token, (1, 0), value=0.0)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token estimate of KL(policy || reference) from tokens sampled by the policy.

    With `d = logprobs - ref_logprobs`: k1 = d, k2 = d**2 / 2, k3 = exp(-d) + d - 1 (Schulman's
    estimators; k3 is unbiased and never negative).
    """
    d = logprobs - ref_logprobs
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        return torch.exp(-d) + d - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; known: {list(get_args(KLEstimator))}")


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    settings: LossConfig | None = None,
    *,
    behaviour_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The clipped policy-gradient loss of a batch, and its diagnostics.

    Args:
        logprobs: the trainer's logprobs of the sampled tokens under the current parameters
            (requires grad), [B, T].
        old_logprobs: the same under the parameters that start this update (no grad), [B, T].
        advantages: one per sequence [B] or per token [B, T].
        loss_mask: 1 (or True) for tokens to train on, 0 elsewhere, [B, T].
        settings: the loss settings (`trainer.loss` in config; defaults when None):
            - clip_low, clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high];
            - dual_clip_c: for negative advantages the per-token loss is capped at `-c * A`
              (dual-clip PPO); None turns it off. Must be > 1;
            - reduction: `token_mean`, `seq_mean_token_mean` or `seq_mean_token_sum_norm`;
            - norm_len: the constant divisor of `seq_mean_token_sum_norm`; default T;
            - tis_cap: the cap of the TIS weight below (None: uncapped);
            - kl_coef, kl_estimator: add `kl_coef * KL_estimate` per token (needs ref_logprobs).
            `tis` is the caller's switch: it passes `behaviour_logprobs` only when it is on.
        behaviour_logprobs: the engine's logprobs of the tokens; when given, each token's loss
            is weighted by `min(exp(old - behaviour), tis_cap)` (detached).
        ref_logprobs: the reference model's logprobs, for the KL penalty.

    Returns:
        The scalar loss and float metrics: `clip_fraction`, `dual_clip_fraction`, `approx_kl`
        (k3 of old vs current), `ratio_mean`, and `tis_weight_mean` / `kl` when used; all are
        means over masked tokens.
    """
    settings = settings or LossConfig()
    clip_low, clip_high, dual_clip_c = settings.clip_low, settings.clip_high, settings.dual_clip_c
    reduction, norm_len, kl_coef = settings.reduction, settings.norm_len, settings.kl_coef
    shape = logprobs.shape
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got {tuple(shape)}")
    for name, tensor in (
        ("old_logprobs", old_logprobs),
        ("loss_mask", loss_mask),
        ("behaviour_logprobs", behaviour_logprobs),
        ("ref_logprobs", ref_logprobs),
    ):
        if tensor is not None and tensor.shape != shape:
            raise ValueError(f"{name} {tuple(tensor.shape)} must match logprobs {tuple(shape)}")
    if advantages.shape == shape[:1]:
        advantages = advantages.unsqueeze(1).expand(shape)
    elif advantages.shape != shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} must be [B] or [B, T]")
    if kl_coef != 0.0 and ref_logprobs is None:
        raise ValueError("kl_coef is set but no ref_logprobs were given")

    mask = loss_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)

    def masked(t: Tensor) -> Tensor:
        # where() routes no gradient to masked positions, even when they hold -inf or NaN
        return torch.where(mask, t, zero)

    logprobs = masked(logprobs)
    old = masked(old_logprobs.detach())
    advantages = masked(advantages.detach().to(logprobs.dtype))

    log_ratio = logprobs - old
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(mask)
    if dual_clip_c is not None:
        cap = -dual_clip_c * advantages
        dual_clipped = (advantages < 0) & (per_token > cap)
        per_token = torch.where(dual_clipped, cap, per_token)

    metrics: dict[str, float] = {}
    if behaviour_logprobs is not None:
        weight = torch.exp(old - masked(behaviour_logprobs.detach()))
        if settings.tis_cap is not None:
            weight = torch.clamp(weight, max=settings.tis_cap)
        per_token = per_token * weight
        metrics["tis_weight_mean"] = token_mean(weight, mask)
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, masked(ref_logprobs.detach()), settings.kl_estimator)
        per_token = per_token + kl_coef * kl
        metrics["kl"] = token_mean(kl, mask)

    loss = reduce_tokens(masked(per_token), mask, reduction, norm_len)
    metrics.update(
        clip_fraction=token_mean(clipped > unclipped, mask),
        dual_clip_fraction=token_mean(dual_clipped, mask),
        approx_kl=token_mean((ratio - 1.0) - log_ratio, mask),
        ratio_mean=token_mean(ratio, mask),
    )
    return loss, metrics


def reduce_tokens(
    per_token: Tensor, mask: Tensor, reduction: Reduction, norm_len: int | None
) -> Tensor:
    """The loss of per-token terms under `reduction` (a loss of one's own reduces with it, so
    the built-in trainer's micro-batch weights stay right: `PolicyLoss.reduction`)."""
    # per_token is already 0 at masked positions; an all-masked batch gives a 0 loss in the graph
    if reduction == "token_mean":
        return per_token.sum() / mask.sum().clamp(min=1)
    sums = per_token.sum(dim=1)
    if reduction == "seq_mean_token_mean":
        counts = mask.sum(dim=1)
        has_tokens = counts > 0
        seq_means = sums / counts.clamp(min=1)
        return seq_means.sum() / has_tokens.sum().clamp(min=1)
    length = per_token.shape[1] if norm_len is None else norm_len
    return sums.sum() / length / max(per_token.shape[0], 1)


def token_mean(values: Tensor, mask: Tensor) -> float:
    with torch.no_grad():
        count = int(mask.sum())
        if count == 0:
            return 0.0
        return float(values.to(torch.float64)[mask].sum() / count)
