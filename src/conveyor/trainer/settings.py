"""Typed settings of the built-in PyTorch trainer (`conveyor.trainer.engine`).

Torch-free, so configuration can embed `TrainerSettings` without importing torch. The loss
settings mirror the arguments of `conveyor.trainer.losses.policy_loss`; the math is in
`docs/algorithms.md`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Same names as conveyor.trainer.losses.Reduction / KLEstimator (that module imports torch);
# tests/trainer/test_engine.py checks they agree.
LossReduction = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimatorName = Literal["k1", "k2", "k3"]


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LossSettings(_Settings):
    """The policy loss: PPO-clip with dual clip, reduction, truncated IS and a KL penalty."""

    reduction: LossReduction = Field(
        default="token_mean",
        description="token_mean | seq_mean_token_mean | seq_mean_token_sum_norm (Dr. GRPO); "
        "applied over the whole batch, however it is split into micro-batches.",
    )
    clip_low: float = Field(default=0.2, ge=0.0, description="ratio lower clip: 1 - clip_low")
    clip_high: float = Field(default=0.2, ge=0.0, description="ratio upper clip: 1 + clip_high")
    dual_clip_c: float | None = Field(
        default=3.0, gt=1.0, description="dual-clip cap -c*A for negative advantages; None: off"
    )
    norm_len: int | None = Field(
        default=None,
        gt=0,
        description="seq_mean_token_sum_norm divisor; None: the longest sequence of the batch "
        "(a per-batch constant, so micro-batching does not change the loss).",
    )
    tis: bool = Field(
        default=False,
        description="Truncated importance sampling: weight each token by "
        "min(exp(trainer_old - behaviour), tis_cap), for off-policy (async) data.",
    )
    tis_cap: float | None = Field(default=2.0, gt=0.0, description="TIS cap; None: uncapped")
    kl_coef: float = Field(default=0.0, ge=0.0, description="KL-to-reference weight")
    kl_estimator: KLEstimatorName = "k3"


class LoraSettings(_Settings):
    """Optional LoRA adapters (peft); `export_weights` always hands out merged weights."""

    enabled: bool = False
    r: int = Field(default=16, gt=0)
    alpha: float = Field(default=32.0, gt=0.0, description="LoRA scale is alpha / r")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        description="Module names to adapt (peft `target_modules`).",
    )


class TrainerSettings(_Settings):
    """Optimizer, schedule, batching, precision and parallelism of `TorchTrainingEngine`."""

    lr: float = Field(default=1e-6, ge=0.0, description="peak learning rate")
    weight_decay: float = Field(default=0.0, ge=0.0, description="AdamW decoupled weight decay")
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0.0, description="AdamW epsilon")
    warmup_steps: int = Field(default=0, ge=0, description="linear warm-up over this many steps")
    total_steps: int | None = Field(
        default=None, gt=0, description="length of the cosine/linear decay; required for them"
    )
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    min_lr_ratio: float = Field(
        default=0.0, ge=0.0, le=1.0, description="cosine/linear decay ends at lr * min_lr_ratio"
    )
    max_grad_norm: float | None = Field(
        default=1.0, gt=0.0, description="clip the global gradient norm; None: no clipping"
    )
    micro_batch_tokens: int = Field(
        default=8192, gt=0, description="padded tokens per forward/backward pass"
    )
    temperature: float = Field(
        default=1.0, gt=0.0, description="sampling temperature; logits are divided by it"
    )
    loss: LossSettings = Field(default_factory=LossSettings)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="bfloat16: autocast forward/backward (weights and AdamW stay float32); an "
        "error on a device without bf16 support.",
    )
    gradient_checkpointing: bool = False
    fsdp: bool = Field(
        default=False,
        description="Shard the model with FSDP2 over the initialised torch.distributed group.",
    )
    device: str = Field(default="auto", description="auto (cuda if available) | cpu | cuda[:n]")
    seed: int = 0

    @model_validator(mode="after")
    def _decay_needs_length(self) -> TrainerSettings:
        if self.schedule != "constant" and self.total_steps is None:
            raise ValueError(f"schedule {self.schedule!r} needs total_steps")
        return self
