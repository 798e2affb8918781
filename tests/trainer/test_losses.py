"""The policy loss against hand-computed values, and exact zero gradient on masked tokens."""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch

from conveyor.config import LossConfig
from conveyor.trainer.losses import Reduction, kl_penalty, policy_loss, sequence_logprobs

LN2 = math.log(2.0)


def log(*values: float) -> torch.Tensor:
    """A [1, T] tensor of logs of the given probabilities (or ratios), requiring grad."""
    return torch.tensor([[math.log(v) for v in values]], dtype=torch.float64, requires_grad=True)


def ones(*shape: int) -> torch.Tensor:
    return torch.ones(*shape, dtype=torch.float64)


def zeros(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.float64)


def test_ppo_clip_both_sides_and_dual_clip() -> None:
    # ratios r with old = 0, eps 0.2; per-token loss = max(-A r, -A clip(r, 0.8, 1.2))
    #   r=1.5 A=+1: max(-1.5, -1.2) = -1.2   (clipped high, no gradient)
    #   r=0.5 A=+1: max(-0.5, -0.8) = -0.5   (unclipped, grad -A r / 5 = -0.1)
    #   r=0.5 A=-1: max( 0.5,  0.8) =  0.8   (clipped low, no gradient)
    #   r=1.5 A=-1: max( 1.5,  1.2) =  1.5   (unclipped, grad 1.5 / 5 = 0.3)
    #   r=4.0 A=-1: max( 4.0,  1.2) =  4.0   -> dual clip caps it at -3 A = 3 (no gradient)
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = ones(1, 5)

    lp = log(1.5, 0.5, 0.5, 1.5, 4.0)
    loss, metrics = policy_loss(lp, zeros(1, 5), advantages, mask, LossConfig(dual_clip_c=None))
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 1.5 + 4.0) / 5)
    loss.backward()
    assert lp.grad is not None
    assert lp.grad[0].tolist() == pytest.approx([0.0, -0.1, 0.0, 0.3, 0.8])
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)
    assert metrics["dual_clip_fraction"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 0.5 + 1.5 + 4.0) / 5)

    lp = log(1.5, 0.5, 0.5, 1.5, 4.0)
    loss, metrics = policy_loss(lp, zeros(1, 5), advantages, mask, LossConfig(dual_clip_c=3.0))
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 1.5 + 3.0) / 5)
    loss.backward()
    assert lp.grad is not None
    assert lp.grad[0].tolist() == pytest.approx([0.0, -0.1, 0.0, 0.3, 0.0])
    assert metrics["dual_clip_fraction"] == pytest.approx(1 / 5)


def test_asymmetric_clip_higher() -> None:
    # r = 1.25, A = +1: clip_high 0.2 gives -1.2; clip_high 0.28 (DAPO) leaves it at -1.25
    # r = 0.75, A = -1: clip_low 0.2 gives 0.8; clip_low 0.3 leaves it at 0.75
    lp = log(1.25, 0.75)
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64).reshape(1, 2)
    loss, _ = policy_loss(lp, zeros(1, 2), advantages, ones(1, 2))
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    loss, _ = policy_loss(
        lp, zeros(1, 2), advantages, ones(1, 2), LossConfig(clip_low=0.3, clip_high=0.28)
    )
    assert loss.item() == pytest.approx((-1.25 + 0.75) / 2)


@pytest.mark.parametrize(
    ("reduction", "norm_len", "expected"),
    [
        # ratio 1 everywhere, so the per-token loss is -A; kept tokens: row 0 -> 1, 2; row 1 -> 4
        ("token_mean", None, -(1 + 2 + 4) / 3),
        ("seq_mean_token_mean", None, -((1 + 2) / 2 + 4 / 1) / 2),
        ("seq_mean_token_sum_norm", None, -((1 + 2) / 3 + 4 / 3) / 2),
        ("seq_mean_token_sum_norm", 4, -((1 + 2) / 4 + 4 / 4) / 2),
    ],
)
def test_reductions(reduction: Reduction, norm_len: int | None, expected: float) -> None:
    advantages = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, _ = policy_loss(
        zeros(2, 3),
        zeros(2, 3),
        advantages,
        mask,
        LossConfig(reduction=reduction, norm_len=norm_len),
    )
    assert loss.item() == pytest.approx(expected)


def test_reductions_with_an_empty_sequence() -> None:
    # a third, fully masked row: seq_mean_token_mean leaves it out, Dr. GRPO divides by B = 3
    advantages = torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64)  # per-sequence [B]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    args = (zeros(3, 3), zeros(3, 3), advantages, mask)
    assert policy_loss(*args, LossConfig(reduction="token_mean"))[0].item() == pytest.approx(
        -(1 + 1 + 4) / 3
    )
    assert policy_loss(*args, LossConfig(reduction="seq_mean_token_mean"))[
        0
    ].item() == pytest.approx(-(1 + 4) / 2)
    assert policy_loss(*args, LossConfig(reduction="seq_mean_token_sum_norm"))[
        0
    ].item() == pytest.approx(-(2 / 3 + 4 / 3 + 0) / 3)


def test_fully_masked_batch_gives_zero_loss_and_zero_grad() -> None:
    lp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    for reduction in get_args(Reduction):
        loss, metrics = policy_loss(
            lp, zeros(2, 3), ones(2), zeros(2, 3), LossConfig(reduction=reduction)
        )
        assert loss.item() == 0.0 and metrics["ratio_mean"] == 0.0
        (grad,) = torch.autograd.grad(loss, lp)
        assert torch.equal(grad, torch.zeros(2, 3, dtype=torch.float64))


def test_truncated_importance_sampling_cap() -> None:
    # old - behaviour: ln 3 (weight 3, capped at 2) and -ln 2 (weight 0.5); ratio 1, A = +1
    # per-token loss = -A * w: token_mean = -(2 + 0.5) / 2; grad = -w / 2 = [-1, -0.25]
    old = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    behaviour = old - torch.tensor([[math.log(3.0), -LN2]], dtype=torch.float64)
    lp = old.clone().requires_grad_(True)
    loss, metrics = policy_loss(
        lp, old, ones(1), ones(1, 2), LossConfig(tis_cap=2.0), behaviour_logprobs=behaviour
    )
    assert loss.item() == pytest.approx(-1.25)
    assert metrics["tis_weight_mean"] == pytest.approx(1.25)
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad[0].tolist() == pytest.approx([-1.0, -0.25])
    # no cap: weights 3 and 0.5
    loss, metrics = policy_loss(
        lp, old, ones(1), ones(1, 2), LossConfig(tis_cap=None), behaviour_logprobs=behaviour
    )
    assert loss.item() == pytest.approx(-(3.0 + 0.5) / 2)
    assert metrics["tis_weight_mean"] == pytest.approx(1.75)


def test_kl_estimators_by_hand() -> None:
    # d = lp - ref = ln 2 and -ln 2
    lp = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=torch.float64)
    assert kl_penalty(lp, ref, "k1")[0].tolist() == pytest.approx([LN2, -LN2])
    assert kl_penalty(lp, ref, "k2")[0].tolist() == pytest.approx([LN2**2 / 2, LN2**2 / 2])
    # k3 = exp(-d) + d - 1: 0.5 + ln 2 - 1 and 2 - ln 2 - 1
    assert kl_penalty(lp, ref, "k3")[0].tolist() == pytest.approx([LN2 - 0.5, 1 - LN2])
    with pytest.raises(ValueError, match="unknown KL"):
        kl_penalty(lp, ref, "k4")  # type: ignore[arg-type]


def test_kl_penalty_added_per_token_before_reduction() -> None:
    # A = 0, so the loss is kl_coef * mean(k3) = 0.1 * ((ln2 - 0.5) + (1 - ln2)) / 2 = 0.025
    # d(k3)/d(lp) = 1 - exp(ref - lp): 1 - 0.5 and 1 - 2, times 0.1 / 2 tokens
    lp = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]], dtype=torch.float64)
    loss, metrics = policy_loss(
        lp, lp.detach(), zeros(1), ones(1, 2), LossConfig(kl_coef=0.1), ref_logprobs=ref
    )
    assert loss.item() == pytest.approx(0.025)
    assert metrics["kl"] == pytest.approx(0.25)
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad[0].tolist() == pytest.approx([0.5 * 0.05, -1.0 * 0.05])
    loss, _ = policy_loss(
        lp,
        lp.detach(),
        zeros(1),
        ones(1, 2),
        LossConfig(kl_coef=0.1, kl_estimator="k2"),
        ref_logprobs=ref,
    )
    assert loss.item() == pytest.approx(0.1 * LN2**2 / 2)


def test_approx_kl_metric() -> None:
    # k3 of old vs current: (r - 1) - ln r with r = 1.5 and r = 0.5
    _, metrics = policy_loss(log(1.5, 0.5), zeros(1, 2), ones(1), ones(1, 2))
    expected = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    assert metrics["approx_kl"] == pytest.approx(expected)


@pytest.mark.parametrize("reduction", get_args(Reduction))
def test_masked_tokens_get_exactly_zero_gradient(reduction: Reduction) -> None:
    generator = torch.Generator().manual_seed(0)
    shape = (3, 7)
    mask = torch.rand(shape, generator=generator) > 0.4
    mask[2] = False  # one sequence with no trained token at all
    old = -torch.rand(shape, generator=generator, dtype=torch.float64) * 3
    behaviour = old + 0.3 * torch.randn(shape, generator=generator, dtype=torch.float64)
    ref = old + 0.3 * torch.randn(shape, generator=generator, dtype=torch.float64)
    # padding-style garbage where nothing is trained must neither leak gradient nor make NaN
    old[~mask] = -math.inf
    behaviour[~mask] = math.nan
    ref[~mask] = -math.inf
    current = old.nan_to_num(neginf=-50.0) + 0.5 * torch.randn(
        shape, generator=generator, dtype=torch.float64
    )
    lp = current.requires_grad_(True)
    advantages = torch.randn(shape, generator=generator, dtype=torch.float64)
    advantages[~mask] = math.nan
    loss, metrics = policy_loss(
        lp,
        old,
        advantages,
        mask.long(),
        LossConfig(clip_low=0.1, clip_high=0.1, reduction=reduction, tis_cap=2.0, kl_coef=0.05),
        behaviour_logprobs=behaviour,
        ref_logprobs=ref,
    )
    assert torch.isfinite(loss)
    assert all(math.isfinite(v) for v in metrics.values())
    (grad,) = torch.autograd.grad(loss, lp)
    assert (grad[~mask] == 0.0).all()  # exactly zero, not merely small
    assert (grad[mask] != 0.0).sum() > 0  # and the trained tokens do learn


def test_sequence_logprobs_matches_manual_softmax() -> None:
    logits = torch.tensor(
        [[[1.0, 2.0, 0.5, -1.0], [0.0, 0.0, 3.0, 1.0], [2.0, -2.0, 0.0, 1.0]]],
        dtype=torch.float64,
    )
    input_ids = torch.tensor([[3, 1, 2]])

    def manual(row: list[float], token: int, temperature: float = 1.0) -> float:
        exps = [math.exp(x / temperature) for x in row]
        return math.log(exps[token] / sum(exps))

    rows = logits[0].tolist()
    out = sequence_logprobs(logits, input_ids)
    assert out.shape == (1, 3)
    # position t is scored by the logits at t - 1; nothing predicts position 0
    assert out[0].tolist() == pytest.approx([0.0, manual(rows[0], 1), manual(rows[1], 2)])
    hot = sequence_logprobs(logits, input_ids, temperature=0.7)
    assert hot[0].tolist() == pytest.approx([0.0, manual(rows[0], 1, 0.7), manual(rows[1], 2, 0.7)])
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        sequence_logprobs(logits, input_ids[:, :2])


def test_invalid_arguments_fail_loud() -> None:
    x = zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(x, x, zeros(3), ones(2, 3))
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(x, zeros(2, 2), zeros(2), ones(2, 3))
    with pytest.raises(ValueError, match="dual_clip_c"):
        policy_loss(x, x, zeros(2), ones(2, 3), LossConfig(dual_clip_c=1.0))
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(x, x, zeros(2), ones(2, 3), LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="reduction"):  # the settings refuse it
        policy_loss(x, x, zeros(2), ones(2, 3), LossConfig(reduction="sum"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="norm_len"):
        policy_loss(
            x, x, zeros(2), ones(2, 3), LossConfig(reduction="seq_mean_token_sum_norm", norm_len=0)
        )
