"""Policy losses as parts: what the built-in trainer asks of a loss, and the built-in `ppo_clip`.

`trainer.loss: {name, options}` names a `LossSpec` in `conveyor.registry.LOSSES`; its `build`
takes the validated options and returns a `PolicyLoss`. A new loss is one module: an options
model, a class with the three attributes and the call below, and ``LOSSES.add(LossSpec(...))``
(tests/plugins/parts/reinforce_loss.py is one). This module imports no torch, so registering the
built-in loss (what config validation needs) stays cheap; the math is in
`conveyor.trainer.losses`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from conveyor.config.base import PartChoice
from conveyor.config.training import LossConfig, LossReduction
from conveyor.registry import LOSSES, LossSpec

if TYPE_CHECKING:
    from torch import Tensor


class PolicyLoss(Protocol):
    """A policy loss the built-in trainer calls once per micro-batch.

    - `reduction`: how its per-token terms combine over a batch (`token_mean`, ...): the
      trainer weights each micro-batch by it, so the batch loss does not depend on how the batch
      is split;
    - `zero_advantage_is_idle`: a sample with advantage 0 has exactly zero gradient (the
      trainer then does not forward it; a KL term breaks this);
    - `uses_behaviour`: it wants the engine's (behaviour) logprobs, for off-policy weights.
    """

    @property
    def reduction(self) -> LossReduction: ...

    @property
    def zero_advantage_is_idle(self) -> bool: ...

    @property
    def uses_behaviour(self) -> bool: ...

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        loss_mask: Tensor,
        *,
        norm_len: int,
        behaviour_logprobs: Tensor | None = None,
        ref_logprobs: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """The scalar loss of one micro-batch ([B, T] tensors, `advantages` [B]) and float
        metrics (means over its trained tokens); `norm_len` is the longest sequence of the
        whole batch (a per-batch constant a reduction may divide by)."""
        ...


@dataclass(frozen=True)
class PPOClip:
    """`ppo_clip`: `conveyor.trainer.losses.policy_loss` with `settings` (`LossConfig`)."""

    settings: LossConfig

    @property
    def reduction(self) -> LossReduction:
        return self.settings.reduction

    @property
    def zero_advantage_is_idle(self) -> bool:
        # every policy-loss term is a multiple of the advantage; the KL penalty is not
        return self.settings.kl_coef == 0.0

    @property
    def uses_behaviour(self) -> bool:
        return self.settings.tis

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        loss_mask: Tensor,
        *,
        norm_len: int,
        behaviour_logprobs: Tensor | None = None,
        ref_logprobs: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        from conveyor.trainer.losses import policy_loss

        # The divisor is fixed for the whole batch, so micro-batching does not change the loss.
        batch = self.settings.model_copy(update={"norm_len": self.settings.norm_len or norm_len})
        return policy_loss(
            logprobs,
            old_logprobs,
            advantages,
            loss_mask,
            batch,
            behaviour_logprobs=behaviour_logprobs,
            ref_logprobs=ref_logprobs,
        )


def build_ppo_clip(options: LossConfig) -> PPOClip:
    """The `build` of `ppo_clip`."""
    return PPOClip(options)


LOSSES.add(
    LossSpec(
        name="ppo_clip",
        build=build_ppo_clip,
        options=LossConfig,
        summary="PPO-clip with dual clip, three reductions, truncated IS and a KL penalty",
    )
)


def build_loss(choice: PartChoice) -> PolicyLoss:
    """The loss `trainer.loss` names, built with its validated options."""
    loss: PolicyLoss = LOSSES.spec(choice.name).build(choice.options)
    return loss


def ppo_clip_settings(choice: PartChoice, who: str) -> LossConfig:
    """The `ppo_clip` options of `trainer.loss`, for a trainer (`who`) that runs only that loss
    (the Tinker service maps it onto its own losses); a `ValueError` for any other loss."""
    if isinstance(choice.options, LossConfig):
        return choice.options
    raise ValueError(
        f"trainer.loss {choice.name!r}: {who} runs only the built-in loss 'ppo_clip' "
        "(set trainer.loss to ppo_clip, or train with trainer.backend builtin)"
    )


def without_off_policy_weights(choice: PartChoice) -> PartChoice:
    """`trainer.loss` as a warm start uses it: no truncated importance sampling (its samples
    are demonstrations, with no behaviour logprobs of the engine)."""
    if isinstance(choice.options, LossConfig):
        return choice.model_copy(
            update={"options": choice.options.model_copy(update={"tis": False})}
        )
    return choice
