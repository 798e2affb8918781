"""The config sections of training: the RL loop (`rl`) and the built-in PyTorch trainer (`trainer`).

These classes are what the trainer itself takes (`TorchTrainingEngine(model_dir, config.trainer)`,
`build_loss(config.trainer.loss)`): one class per concept, no mirror. They are torch-free.
The math is in docs/algorithms.md.
"""

import re
from importlib import metadata
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from conveyor.config.base import PartChoice, Section, chooser, default_part
from conveyor.registry import ADVANTAGES, BACKENDS, LOSSES

# Same names as conveyor.trainer.losses.Reduction / KLEstimator (that module imports torch);
# tests/trainer/test_engine.py checks they agree.
LossReduction = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimatorName = Literal["k1", "k2", "k3"]


class LossConfig(Section):
    """The options of the built-in policy loss `ppo_clip` (`trainer.loss.options`): PPO-clip
    with dual clip, reduction, truncated IS and a KL penalty."""

    reduction: LossReduction = Field(
        default="token_mean",
        description="token_mean | seq_mean_token_mean | seq_mean_token_sum_norm (Dr. GRPO); "
        "applied over the whole batch, however it is split into micro-batches.",
    )
    clip_low: float = Field(default=0.2, ge=0, description="PPO ratio lower clip: 1 - clip_low.")
    clip_high: float = Field(default=0.2, ge=0, description="PPO ratio upper clip: 1 + clip_high.")
    dual_clip_c: float | None = Field(
        default=3.0,
        gt=1,
        description="Dual-clip cap -c*A for negative advantages; null turns it off.",
    )
    norm_len: int | None = Field(
        default=None,
        gt=0,
        description="seq_mean_token_sum_norm divisor; null: the longest sequence of the batch "
        "(a per-batch constant, so micro-batching does not change the loss).",
    )
    tis: bool = Field(
        default=False,
        description="Truncated importance sampling: weight each token by "
        "min(exp(trainer_old - behaviour), tis_cap), for off-policy (async) data.",
    )
    tis_cap: float | None = Field(default=2.0, gt=0, description="TIS weight cap; null: uncapped.")
    kl_coef: float = Field(
        default=0.0,
        ge=0,
        description="KL-to-reference weight; a run refuses > 0 (no loop computes reference "
        "logprobs yet), for callers of policy_loss that pass ref_logprobs.",
    )
    kl_estimator: KLEstimatorName = Field(default="k3", description="KL estimator.")


# Fields naming a part: `{name, options}` (or the name alone), checked by the part's own spec.
AdvantageChoice = Annotated[
    PartChoice, BeforeValidator(chooser(ADVANTAGES, "rl.advantage", "grpo"))
]
LossChoice = Annotated[PartChoice, BeforeValidator(chooser(LOSSES, "trainer.loss", "ppo_clip"))]
BackendChoice = Annotated[
    PartChoice, BeforeValidator(chooser(BACKENDS, "trainer.backend", "builtin"))
]


class LoraConfig(Section):
    """Optional LoRA adapters (peft); exported weights are always merged."""

    enabled: bool = Field(default=False, description="Train LoRA adapters instead of all weights.")
    r: int = Field(default=16, gt=0, description="LoRA rank.")
    alpha: float = Field(default=32.0, gt=0, description="LoRA alpha; the scale is alpha / r.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="LoRA dropout.")
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


class TrainerConfig(Section):
    """The built-in PyTorch trainer (`TorchTrainingEngine`): optimizer, schedule, batching,
    precision, parallelism.

    Two values it needs are not keys of this section, so each setting has one key: the length of
    a decaying schedule is `rl.steps`, and the logits temperature is `sampling.temperature`
    (the composition root passes both to the engine).
    """

    backend: BackendChoice = Field(
        default_factory=default_part(BACKENDS, "trainer.backend", "builtin"),
        description="The training backend, {name, options} or a name: 'builtin' (this PyTorch "
        "trainer), 'ray_fsdp' (it as cluster.trainer_workers Ray actors, FSDP2; needs "
        "cluster.address), 'tinker' (the Tinker service; pairs with engine.kind 'tinker'), or "
        "one registered by a plugin, with options of its own. `conveyor backends` says which "
        "are usable here, and lists VeRL and SkyRL-train, whose trainers drive our rollouts. "
        "The settings below are the built-in trainer's; Tinker takes lr, betas, eps, "
        "weight_decay, loss and lora.r.",
    )
    lr: float = Field(default=1e-6, ge=0, description="Peak learning rate of the RL updates.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW decoupled weight decay.")
    betas: list[float] = Field(
        default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2, description="AdamW betas."
    )
    eps: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warm-up steps.")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        default="constant", description="Learning-rate decay over rl.steps."
    )
    min_lr_ratio: float = Field(
        default=0.0, ge=0, le=1, description="cosine/linear decay ends at lr * min_lr_ratio."
    )
    max_grad_norm: float | None = Field(
        default=1.0, gt=0, description="Clip the global gradient norm; null: no clipping."
    )
    micro_batch_tokens: int = Field(
        default=4096,
        gt=0,
        description="Padded tokens per forward/backward pass (real tokens with packing).",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="bfloat16: autocast forward/backward (weights and AdamW stay float32); an "
        "error on a GPU without bf16 support. auto: bfloat16 where the device computes it "
        "natively (a CUDA GPU with bf16, a CPU with AVX512-BF16 or AMX), float32 elsewhere: "
        "on an AVX2 CPU bf16 autocast is emulated and ran 15x slower than float32.",
    )
    gradient_checkpointing: bool = Field(default=False, description="Trade compute for memory.")
    train_last_layers: int | None = Field(
        default=None,
        ge=1,
        description="Train only the last N decoder blocks and the final norm; the embeddings "
        "and the blocks below stay frozen, so backward stops at block N from the top (cheaper "
        "steps, no optimizer state below). With lora.enabled, adapters go on those blocks only. "
        "null: every weight (or every targeted module) trains.",
    )
    fsdp: bool = Field(
        default=False,
        description="Shard the model with FSDP2; each rank loads only its shard of the "
        "safetensors checkpoint (no rank holds the whole model). On the built-in backend "
        "the trainer then runs as trainer.fsdp_ranks local processes (gloo on CPU, NCCL and "
        "one GPU each on CUDA), no Ray needed; under 'ray_fsdp' the Ray workers are the ranks.",
    )
    fsdp_ranks: int | None = Field(
        default=None,
        ge=1,
        description="trainer.fsdp on the built-in backend: how many local rank processes to "
        "shard over. null: one per visible CUDA GPU (a CPU trainer must set it).",
    )
    logits_chunk_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Run the LM head and log-softmax on this many kept positions at a time "
        "under activation checkpointing (trainer/chunked.py), so no [tokens x vocabulary] "
        "float32 logits exist: the memory lever at long context (32k tokens of a 152k "
        "vocabulary: 70 -> 22 GiB peak on a GPU, docs/scale.md). Same values as the whole "
        "logits. null: the LM head runs on all kept positions at once. Checked at load against "
        "the model's own logits (a head with a bias, logit scaling or softcapping is refused).",
    )
    packing: bool = Field(
        default=False,
        description="Lay each micro-batch's sequences end to end in one row, positions "
        "restarting per sequence (transformers >= 4.56 masks across sequence boundaries), "
        "instead of right-padding them; micro_batch_tokens then counts real tokens. Same "
        "values as padding; pays where there is padding to save and attention skips other "
        "sequences (flex or flash attention; under sdpa a long packed row is one dense mask, "
        "docs/scale.md). Checked at load on the model (packed vs separate logprobs).",
    )
    context_parallel: int = Field(
        default=1,
        ge=1,
        description="Context-parallel degree: each micro-batch's rows are split into this many "
        "contiguous chunks of tokens, one per rank of a context-parallel group (consecutive "
        "FSDP ranks), with global positions; attention is exact over the whole sequence by "
        "Ulysses all-to-alls of the attention heads (trainer/context_parallel.py, "
        "docs/scale.md). Activations per rank shrink by this factor; the ranks of a group run "
        "the same micro-batches, so data parallelism is the trainer ranks / this. Needs "
        "fsdp: true, a rank count it divides, and attention heads it divides. Works with "
        "packing and logits_chunk_tokens. 1: off.",
    )
    device: str = Field(default="auto", description="auto (cuda if available) | cpu | cuda[:n].")
    seed: int = Field(default=0, description="Seed of the trainer's torch RNG.")
    loss: LossChoice = Field(
        default_factory=default_part(LOSSES, "trainer.loss", "ppo_clip"),
        description="The policy loss, {name, options} or a name: 'ppo_clip' (options: "
        "reduction, clip_low, clip_high, dual_clip_c, norm_len, tis, tis_cap, kl_coef, "
        "kl_estimator) or one registered by a plugin.",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters.")

    @model_validator(mode="after")
    def _context_parallel_needs_ranks(self) -> "TrainerConfig":
        if self.context_parallel > 1:
            if not self.fsdp:
                raise ValueError(
                    f"trainer.context_parallel={self.context_parallel} needs trainer.fsdp: true "
                    "(the context-parallel ranks are FSDP ranks)"
                )
            if self.fsdp_ranks is not None and self.fsdp_ranks % self.context_parallel:
                raise ValueError(
                    f"trainer.context_parallel={self.context_parallel} must divide "
                    f"trainer.fsdp_ranks={self.fsdp_ranks}"
                )
        return self

    @field_validator("packing")
    @classmethod
    def _transformers_masks_packed_rows(cls, packing: bool) -> bool:
        if packing:
            refusal = packing_unsupported()
            if refusal is not None:
                raise ValueError(refusal)
        return packing


# transformers builds a block-diagonal causal mask from restarting position_ids since 4.56
# (`masking_utils.find_packed_sequence_indices`); before, a packed row attends across sequences
PACKED_MASK_TRANSFORMERS = (4, 56)


def packing_unsupported(version: str | None = None) -> str | None:
    """Why `trainer.packing` cannot work with the installed transformers (or `version`), or
    None. Without transformers here (a Tinker-only setup) there is nothing to refuse yet."""
    if version is None:
        try:
            version = metadata.version("transformers")
        except metadata.PackageNotFoundError:
            return None
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is not None and (int(found[1]), int(found[2])) >= PACKED_MASK_TRANSFORMERS:
        return None
    return (
        f"trainer.packing needs transformers >= 4.56, which masks attention across the "
        f"sequences of a packed row from restarting position_ids; transformers {version} "
        "would let each sequence attend to the ones before it (wrong logprobs)"
    )


class WarmStartConfig(Section):
    """The supervised warm start on oracle traces (or a family's demonstrations) before RL."""

    steps: int = Field(
        default=0, ge=0, description="Supervised warm-start updates on oracle traces first."
    )
    tasks: int = Field(default=64, gt=0, description="Oracle traces per family for the warm start.")
    batch_size: int = Field(default=16, gt=0, description="Oracle traces per warm-start update.")
    lr: float = Field(default=1e-4, ge=0, description="Learning rate of the warm start.")
    train_last_layers: Annotated[int, Field(ge=1)] | Literal["all"] | None = Field(
        default=None,
        description="Decoder blocks the warm start trains, from the top: N, or 'all' (full "
        "fine-tuning, also when trainer.lora.enabled: LoRA then applies to RL only); null: "
        "what trainer.train_last_layers (and trainer.lora) say. A warm start must teach the "
        "plan, not only the format: on the 135M model the top 4 blocks learned the tool "
        "format but answered without reading (docs/algorithms.md).",
    )
    from_run: str | None = Field(
        default=None,
        description="A training run folder whose warm start this run reuses instead of training "
        "its own: its sft_model/, eval_before.json and eval_after_sft.json (with their "
        "trajectories) are copied in, so RL arms (trainer.lr=0, rl.controls.reward=shuffle, "
        "async, another RL setting) start from one warm start and are paired on it. Refused, "
        "naming the keys, when a setting the warm start or its evaluations depend on differs "
        "(model, tasks, agent, tools, rl.eval sizes, the warm start's own rl.warm_start.* and "
        "trainer settings, trainer.seed). null: train the warm start here.",
    )


class EvalConfig(Section):
    """The held-out evaluations around training (before, after the warm start, after RL)."""

    tasks: int = Field(
        default=0, ge=0, description="Held-out instances per family, evaluated before and after."
    )
    before_tasks: int | None = Field(
        default=None,
        ge=0,
        description="Held-out instances per family for the base model's evaluation (the first "
        "of the rl.eval.tasks); null: all rl.eval.tasks; 0: none.",
    )
    every: int = Field(default=0, ge=0, description="Validate every N steps; 0: never.")
    stop_halfwidth: float = Field(
        default=0.0,
        ge=0,
        lt=0.5,
        description="Stop a held-out evaluation early once the 95% Wilson interval of the "
        "instances finished in task order is at most this half-width (e.g. 0.05); 0: evaluate "
        "every instance. Paired comparisons then use the instances both evaluations scored.",
    )
    min_tasks: int = Field(
        default=50, ge=1, description="rl.eval.stop_halfwidth: never stop before this many."
    )
    temperature: float = Field(
        default=0.0, ge=0, description="Sampling temperature of evaluations (0 = greedy)."
    )


class GroupsConfig(Section):
    """What a step's groups become before advantages: truncated and incomplete groups."""

    truncated: Literal["score", "mask"] = Field(
        default="score", description="Truncated trajectories: trained with their score, or masked."
    )
    incomplete: Literal["refill", "train_partial", "drop"] = Field(
        default="train_partial",
        description="Groups still missing samples after infra retries: 'refill' re-runs each "
        "missing sample (fresh runtime, same task) up to max_refills rounds, then applies "
        "refill_fallback; 'train_partial' trains the scored ones (at least min_partial_size); "
        "'drop' drops the group.",
    )
    max_refills: int = Field(
        default=1, ge=0, description="incomplete=refill: refill rounds per step."
    )
    refill_fallback: Literal["train_partial", "drop"] = Field(
        default="train_partial",
        description="incomplete=refill: the rule for groups still short after refilling.",
    )
    min_partial_size: int = Field(default=2, ge=1, description="Smallest partial group trained.")
    filter_zero_variance: bool = Field(
        default=False, description="Drop groups whose rewards are all equal (always counted)."
    )


class ControlsConfig(Section):
    """Control arms: the same code path with the learning signal taken away."""

    reward: Literal["none", "shuffle"] = Field(
        default="none",
        description="'shuffle' permutes the rewards among the step's scored rollouts (seeded "
        "by trainer.seed and the step) before statuses and advantages, so the update sees "
        "random rewards through the same code path; rollouts.jsonl and the metrics keep the "
        "true rewards. Pair with trainer.lr=0 for the other control.",
    )


class LoggingConfig(Section):
    """Where metrics go besides metrics.jsonl."""

    tensorboard: bool = Field(default=False, description="Also log to TensorBoard.")
    wandb: bool = Field(default=False, description="Also log to W&B (offline mode).")


class CheckpointsConfig(Section):
    """Training checkpoints, what `--resume` continues from."""

    every: int = Field(default=1, ge=0, description="Checkpoint every N steps; 0: off.")
    keep: int = Field(default=2, gt=0, description="Newest checkpoints kept.")


class RLConfig(Section):
    """The RL loop: steps, data, sync/async and advantages here; one section per other concept
    (warm start, evaluations, groups, controls, logging, checkpoints)."""

    steps: int = Field(default=10, ge=0, description="RL updates to make.")
    tasks_per_step: int = Field(
        default=8, gt=0, description="Task instances per update (each sampled tasks.group_size)."
    )
    mode: Literal["sync", "async"] = Field(
        default="sync",
        description="async: generation runs up to max_staleness steps ahead of training "
        "(1: step k+1's rollouts overlap step k's update).",
    )
    max_staleness: int = Field(
        default=1,
        ge=0,
        description="Samples older than this many policy versions are dropped; in async mode "
        "also how many steps generation may run ahead of training.",
    )
    advantage: AdvantageChoice = Field(
        default_factory=default_part(ADVANTAGES, "rl.advantage", "grpo"),
        description="Advantage estimator, {name, options} or a name: grpo (options: "
        "scale_by_std, eps), rloo, reinforce_pp, fixed_baseline (options: baseline), or one "
        "registered by a plugin.",
    )
    export_final: bool = Field(default=True, description="Write the final model as a HF folder.")
    warm_start: WarmStartConfig = Field(
        default_factory=WarmStartConfig, description="The supervised warm start."
    )
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluations.")
    groups: GroupsConfig = Field(
        default_factory=GroupsConfig, description="Truncated and incomplete groups."
    )
    controls: ControlsConfig = Field(default_factory=ControlsConfig, description="Control arms.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metric sinks.")
    checkpoints: CheckpointsConfig = Field(
        default_factory=CheckpointsConfig, description="Checkpoints."
    )
