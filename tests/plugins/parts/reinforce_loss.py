"""A policy loss added from outside the package: REINFORCE, `-coef * A * logprob` per token.

`trainer.loss: {name: reinforce, options: {coef: 0.5}}` trains the built-in trainer with it.
One file: an options model, a class with what the trainer asks of a loss
(`conveyor.trainer.policy_losses.PolicyLoss`), and its `LossSpec`. Every call is recorded in
`$CONVEYOR_PLUGIN_LOG` (when set).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from conveyor.registry import LOSSES, LossSpec
from conveyor.trainer.losses import reduce_tokens, token_mean


class ReinforceOptions(BaseModel):
    """`trainer.loss.options` of `reinforce`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    coef: float = Field(default=1.0, gt=0, description="Weight of the policy-gradient term.")


@dataclass(frozen=True)
class Reinforce:
    """Plain REINFORCE with a token-mean reduction: no ratio, no clipping, no KL."""

    options: ReinforceOptions

    @property
    def reduction(self) -> Literal["token_mean"]:
        return "token_mean"

    @property
    def zero_advantage_is_idle(self) -> bool:
        return True  # every term is a multiple of the advantage

    @property
    def uses_behaviour(self) -> bool:
        return False

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
        """`-coef * A * logprob` over the trained tokens, token-mean reduced."""
        mask = loss_mask.bool()
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1).expand(logprobs.shape)
        zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
        per_token = torch.where(mask, -self.options.coef * advantages.detach() * logprobs, zero)
        log = os.environ.get("CONVEYOR_PLUGIN_LOG")
        if log:
            with open(log, "a") as sink:
                sink.write(f"loss reinforce coef={self.options.coef}\n")
        loss = reduce_tokens(per_token, mask, self.reduction, norm_len)
        return loss, {"logprob_mean": token_mean(logprobs.detach(), mask)}


LOSSES.add(
    LossSpec(
        name="reinforce",
        build=Reinforce,
        options=ReinforceOptions,
        summary="REINFORCE: -coef * advantage * logprob, token mean",
    )
)
