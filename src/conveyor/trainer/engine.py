"""The built-in training backend: PyTorch + transformers, optional LoRA (peft) and FSDP2.

`TorchTrainingEngine.step` makes one AdamW update from a `TrainBatch`:

1. Plan micro-batches by a padded-token budget (`conveyor.trainer.batching`), right-padded.
   Causal attention means a real token never attends to the padding after it, so no attention
   mask is passed and the fast causal kernel runs; outputs at real positions are unchanged.
   With `packing`, each micro-batch is one row of its sequences end to end (positions
   restarting per sequence: transformers masks across the boundaries) and the budget counts
   real tokens; the row's logprobs are scattered back to the padded layout the loss reads.
2. Per micro-batch: forward, `token_logprobs` (= `losses.sequence_logprobs`, faster),
   `policy_loss`, backward. With `logits_chunk_tokens`, the decoder's final hidden states at
   the kept positions go through the LM head in chunks under checkpointing
   (`trainer/chunked.py`) instead of one [positions x vocabulary] logits tensor. Because `step` is
   exactly one optimizer update, the parameters that start the update are the current ones, so
   the "old" logprobs are the detached logprobs of this same forward: equal in value to a
   separate no-grad pass, one forward cheaper. The agreement probe |old - behaviour| is taken
   from them too.
3. Gradient accumulation with global normalisation. `policy_loss` normalises within one call,
   so micro-batch k's loss is multiplied by its share of the batch-wide denominator:
   `token_mean`: trained tokens in k / trained tokens in the batch;
   `seq_mean_token_mean`: sequences with a trained token in k / those in the batch;
   `seq_mean_token_sum_norm`: sequences in k / sequences in the batch, with `norm_len` fixed for
   the whole batch (default: its longest sequence). The summed gradient is then that of the
   batch loss in one call, whatever the budget (tests/trainer/test_engine.py checks it).
4. Clip the global gradient norm, AdamW step, LR schedule step, `policy_version += 1`.

Under FSDP every rank gets the same full batch, runs its share of the micro-batches (padded with
empty ones so all ranks run the same number of passes), and scales its loss by the world size to
undo FSDP's gradient averaging. With `context_parallel` N, groups of N consecutive ranks share
their micro-batches, each rank running one chunk of every row's tokens (`trainer/
context_parallel.py`): the micro-batches are divided among the groups, and every rank of a
group computes the same loss from the group's gathered logprobs.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from conveyor.config.training import LoraConfig, TrainerConfig
from conveyor.engines.base import WeightFingerprint, tensor_digest
from conveyor.trainer import checkpoint, context_parallel
from conveyor.trainer.backend import StepResult, TrainBatch
from conveyor.trainer.batching import (
    MicroBatch,
    assign_to_ranks,
    plan_micro_batches,
    plan_packed_micro_batches,
)
from conveyor.trainer.chunked import chunked_token_logprobs
from conveyor.trainer.fsdp import all_reduce_floats, full_tensor, shard_model, world
from conveyor.trainer.packing import pack
from conveyor.trainer.policy_losses import build_loss
from conveyor.trainer.sharded_load import build_on_meta, load_local_shards, safetensors_index
from conveyor.types import TrainingSample

__all__ = [
    "TorchTrainingEngine",
    "kept_token_logprobs",
    "lr_factor",
    "token_logprobs",
]

_LOSS_METRICS = ("clip_fraction", "dual_clip_fraction", "approx_kl", "ratio_mean")


def lr_factor(step: int, settings: TrainerConfig, total_steps: int | None = None) -> float:
    """The multiplier of the peak LR at update `step` (0-based).

    Linear warm-up `(step + 1) / warmup_steps`, then constant, or a cosine or linear decay from
    1 to `min_lr_ratio` over the remaining `total_steps - warmup_steps` updates.
    """
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    if settings.schedule == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"schedule {settings.schedule!r} needs total_steps")
    span = max(total_steps - settings.warmup_steps, 1)
    progress = min(max((step - settings.warmup_steps) / span, 0.0), 1.0)
    if settings.schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        shape = 1.0 - progress
    return settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * shape


def resolve_device(name: str) -> torch.device:
    """`auto` is the current CUDA device when there is one, else the CPU."""
    if name == "auto":
        return (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else (torch.device("cpu"))
        )
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


@dataclass(frozen=True)
class _PackedRow:
    """A micro-batch's sequences end to end in one row ([1, N] each)."""

    input_ids: Tensor
    position_ids: Tensor
    loss_mask: Tensor  # the sequences' loss masks, 0 at each sequence's first token
    scored: Tensor  # 1 everywhere but at each sequence's first token (no logprob there)
    dest: Tensor  # [N]: each position's flat index in the padded [rows, length] layout


@dataclass(frozen=True)
class _Tensors:
    """A micro-batch in the padded [rows, length] layout the loss reads; `packed` is the row
    the model runs on instead when packing."""

    input_ids: Tensor
    loss_mask: Tensor
    behaviour: Tensor
    advantages: Tensor
    ref: Tensor | None
    packed: _PackedRow | None = None


@dataclass
class _Totals:
    """Accumulators over this rank's micro-batches; summed over ranks at the end."""

    loss: float = 0.0
    diff_sum: float = 0.0
    diff_max: float = 0.0
    metric_sums: dict[str, float] = field(default_factory=dict)

    def add_metrics(self, metrics: dict[str, float], tokens: int) -> None:
        """Add token means of one micro-batch, weighted by its trained tokens."""
        for name, value in metrics.items():
            self.metric_sums[name] = self.metric_sums.get(name, 0.0) + value * tokens


class TorchTrainingEngine:
    """`TrainingBackend` on a Hugging Face causal LM folder (see the module docstring).

    The model loads in float32 (AdamW's master weights); `settings.seed` seeds torch's global
    RNG before LoRA initialisation. Under `fsdp`, call every method on every rank.
    `temperature` divides the logits (the sampling temperature, so logprobs match the engine's);
    `total_steps` is the length of a decaying schedule (required unless it is constant).

    Under `fsdp` the model loads shard by shard (`conveyor.trainer.sharded_load`): built on the
    meta device, sharded, then each rank reads only its rows from the safetensors files, so no
    rank holds the whole model. `sharded_load` False forces the full-load path there (every
    rank loads the whole model, then shards it); None (the default) picks the sharded load
    under `fsdp` unless LoRA is on (peft's adapter initialisation draws from the seeded RNG
    over full tensors) or the folder has no safetensors checkpoint.
    """

    def __init__(
        self,
        model_dir: Path | str,
        settings: TrainerConfig | None = None,
        *,
        temperature: float = 1.0,
        total_steps: int | None = None,
        sharded_load: bool | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.settings = settings = settings or TrainerConfig()
        self.loss = build_loss(settings.loss)
        if temperature <= 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        if settings.schedule != "constant" and total_steps is None:
            raise ValueError(f"schedule {settings.schedule!r} needs total_steps")
        self.temperature = temperature
        self.total_steps = total_steps
        self.device = resolve_device(settings.device)
        self._autocast_dtype = _autocast_dtype(settings, self.device)
        self.sharded_load = _sharded_load(model_dir, settings, sharded_load)
        torch.manual_seed(settings.seed)
        model: Any
        if self.sharded_load:
            model = build_on_meta(model_dir, torch.float32)  # parameters on meta, buffers real
        else:
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        model.config.use_cache = False
        if settings.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if settings.lora.enabled:
            model = _add_lora(model, settings.lora, settings.train_last_layers)
        elif settings.train_last_layers is not None:
            _freeze_below(model, settings.train_last_layers)
        if not self.sharded_load:
            model.to(self.device)
        self.model: nn.Module = model
        self._decoder: nn.Module | None = None
        self._head: nn.Linear | None = None
        if settings.logits_chunk_tokens is not None:
            self._decoder, self._head = _decoder_and_head(model)
        self.rank, self.world_size = world()
        # context parallelism: groups of `cp` consecutive ranks share each micro-batch, each
        # rank one chunk of its tokens; the data-parallel share is by group
        self.cp = settings.context_parallel
        self._cp_group: Any = None
        self._cp_rank, self._dp_rank, self._dp_size = 0, self.rank, self.world_size
        if self.cp > 1:
            if not settings.fsdp:
                raise ValueError("trainer.context_parallel > 1 needs fsdp: true")
            context_parallel.use_on(model, self.cp)
            self._cp_group, self._cp_rank, self._dp_rank = context_parallel.new_groups(self.cp)
            self._dp_size = self.world_size // self.cp
            if self._decoder is None:
                try:
                    self._decoder, self._head = _decoder_and_head(model)
                except ValueError as error:
                    raise ValueError(f"trainer.context_parallel: {error}") from None
        if settings.fsdp:
            shard_model(model, self.device)
            if self.sharded_load:
                load_local_shards(model, model_dir, self.device)
        elif self.world_size > 1:
            raise ValueError("torch.distributed is initialised with several ranks: set fsdp: true")
        self._params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self._params,
            lr=settings.lr,
            betas=(settings.betas[0], settings.betas[1]),
            eps=settings.eps,
            weight_decay=settings.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(step, settings, total_steps)
        )
        self._version = 0
        # The load probes run last: on a sharded load the weights exist only after sharding
        # (the probes' forwards are then collective: every rank runs the same ones), and after
        # an FSDP forward the root unit's parameters stay unsharded, so `model.parameters()`
        # read then would hand the optimizer full tensors instead of the sharded ones.
        if settings.logits_chunk_tokens is not None:
            self._check_chunked_head()
        if settings.packing:
            self._check_packing()
        if self.cp > 1:
            self._check_context_parallel()

    @property
    def policy_version(self) -> int:
        """Updates made so far (restored by `load`)."""
        return self._version

    # -- training ------------------------------------------------------------------------------

    def step(self, batch: TrainBatch) -> StepResult:
        """One AdamW update over the whole batch; see the module docstring for the steps."""
        start = time.perf_counter()
        items = batch.items
        if not items:
            raise ValueError("empty training batch")
        lengths = [len(sample.input_ids) for sample, _ in items]
        counts = [sum(1 for m in sample.loss_mask if m) for sample, _ in items]
        denominators = {
            "token_mean": max(sum(counts), 1),
            "seq_mean_token_mean": max(sum(1 for c in counts if c), 1),
            "seq_mean_token_sum_norm": len(items),
        }
        loss_fn = self.loss
        norm_len = max(lengths)
        # A sample with advantage 0 has exactly zero gradient under a loss that says so (PPO
        # without a KL term: every term is a multiple of its advantage): it counts in the
        # denominators above but is not forwarded. With GRPO that skips every group whose
        # rewards are all equal.
        active = [
            i
            for i, (_, advantage) in enumerate(items)
            if advantage != 0.0 or not loss_fn.zero_advantage_is_idle
        ]
        plan = [
            replace(micro, indices=tuple(active[j] for j in micro.indices))
            for micro in self._plan([lengths[i] for i in active])
        ]
        mine = self._share_of(plan)

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals = _Totals()
        # the ranks of a context-parallel group compute the same loss: one of them counts it
        counted = 1 if self._cp_rank == 0 else 0
        for micro in mine:
            tensors = self._collate(batch, micro)
            try:
                logprobs = self._micro_logprobs(tensors, train=True)
                old = logprobs.detach()
                loss, metrics = loss_fn(
                    logprobs,
                    old,
                    tensors.advantages,
                    tensors.loss_mask,
                    norm_len=norm_len,
                    behaviour_logprobs=tensors.behaviour if loss_fn.uses_behaviour else None,
                    ref_logprobs=tensors.ref,
                )
                weight = (
                    _micro_weight(loss_fn.reduction, micro, counts)
                    / denominators[loss_fn.reduction]
                )
                (loss * (weight * self.world_size)).backward()
            finally:
                context_parallel.deactivate()
            totals.loss += float(loss.detach()) * weight * counted
            mask = tensors.loss_mask.bool()
            diff = torch.where(mask, (old - tensors.behaviour).abs(), 0.0)
            totals.diff_sum += float(diff.sum()) * counted
            totals.diff_max = max(totals.diff_max, float(diff.max()))
            totals.add_metrics(metrics, sum(counts[i] for i in micro.indices) * counted)

        if not plan:
            # Zero gradient, but still one AdamW update (its moments decay and move the weights).
            for param in self._params:
                param.grad = torch.zeros_like(param)
        grad_norm = self._clip_gradients()
        lr = float(self.scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._version += 1

        names = sorted(totals.metric_sums)
        sums = all_reduce_floats(
            [totals.loss, totals.diff_sum, *[totals.metric_sums[n] for n in names]],
            self.device,
        )
        (diff_max,) = all_reduce_floats([totals.diff_max], self.device, op="max")
        trained = sum(counts)
        probed = sum(counts[i] for i in active)
        forwarded = sum(lengths[i] for i in active)
        elapsed = time.perf_counter() - start
        return StepResult(
            loss=sums[0],
            grad_norm=grad_norm,
            lr=lr,
            tokens=forwarded,
            trained_tokens=trained,
            tokens_per_s=forwarded / elapsed,
            logprob_diff_mean=sums[1] / max(probed, 1),
            logprob_diff_max=diff_max,
            probed_tokens=probed,
            policy_version=self._version,
            step_time_s=elapsed,
            metrics={n: s / max(probed, 1) for n, s in zip(names, sums[2:], strict=True)},
            skipped_samples=len(items) - len(active),
        )

    def compute_logprobs(self, samples: Sequence[TrainingSample]) -> list[list[float]]:
        """Current-policy logprobs of each sample's tokens (position 0 is 0.0), in eval mode.

        Under FSDP every rank must call it with the same samples (forwards are collective).
        """
        if not samples:
            return []
        batch = TrainBatch(items=[(sample, 0.0) for sample in samples])
        plan = self._plan([len(s.input_ids) for s in samples])
        out: list[list[float]] = [[] for _ in samples]
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for micro in plan:
                    tensors = self._collate(batch, micro)
                    logprobs = self._micro_logprobs(tensors, train=False).cpu()
                    context_parallel.deactivate()
                    for row, i in enumerate(micro.indices):
                        out[i] = logprobs[row, : len(samples[i].input_ids)].tolist()
        finally:
            context_parallel.deactivate()
            self.model.train(was_training)
        return out

    # -- weights and state ---------------------------------------------------------------------

    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        """Full weights under Hugging Face names (LoRA merged), detached; collective under FSDP.

        Without LoRA or FSDP the tensors share storage with the live parameters: copy them to
        keep them past the next `step`.
        """
        if self.settings.lora.enabled:
            yield from _merged_lora_weights(self.model)
            return
        for name, tensor in self.model.state_dict().items():
            yield name, full_tensor(tensor).detach()

    async def sync_to(self, engine: Any, *, step: int = 0) -> None:
        """Load `export_weights()` into `engine` (a `WeightReceiver`: in-process vLLM or hf, or
        a dev-mode vLLM server) under this backend's policy version."""
        from conveyor.trainer.faults import killing_midway

        await engine.update_weights(killing_midway(self.export_weights(), step), self._version)

    def weight_fingerprint(
        self, like: WeightFingerprint, probe_ids: Sequence[int]
    ) -> WeightFingerprint:
        """The fingerprint an engine holding exactly `export_weights()` would report as `like`.

        Digests of the exported tensors `like` names, cast to the dtype it holds them in (names
        this model does not export are left out), and the temperature-1 logprobs of
        `probe_ids`. Collective under FSDP.
        """
        wanted = set(like.digests)
        digests: dict[str, str] = {}
        shapes: dict[str, list[int]] = {}
        dtypes: dict[str, str] = {}
        for name, tensor in self.export_weights():
            if name in wanted:
                dtypes[name] = like.dtypes.get(name, "float32")
                digests[name] = tensor_digest(tensor, dtypes[name])
                shapes[name] = list(tensor.shape)
        ids = torch.tensor([list(probe_ids)], device=self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                logits = self.model(input_ids=ids, use_cache=False).logits
                probe = token_logprobs(logits, ids)[0].cpu().tolist()
        finally:
            self.model.train(was_training)
        return WeightFingerprint(
            policy_version=self._version,
            digests=digests,
            dtypes=dtypes,
            shapes=shapes,
            probe_logprobs=probe,
        )

    def save(self, path: Path) -> None:
        """Model (or adapter) safetensors, optimizer, scheduler and counters into `path`."""
        checkpoint.write_training_state(
            Path(path),
            self.model,
            self.optimizer,
            self.scheduler,
            trainable_only=self.settings.lora.enabled,
            state={"policy_version": self._version},
        )

    def load(self, path: Path) -> None:
        """Restore what `save` wrote; the settings must describe the same model layout."""
        state = checkpoint.read_training_state(
            Path(path),
            self.model,
            self.optimizer,
            self.scheduler,
            trainable_only=self.settings.lora.enabled,
        )
        self._version = int(state["policy_version"])

    # -- internals -----------------------------------------------------------------------------

    def _plan(self, lengths: list[int]) -> list[MicroBatch]:
        planner = plan_packed_micro_batches if self.settings.packing else plan_micro_batches
        return planner(lengths, self.settings.micro_batch_tokens)

    def _share_of(self, plan: list[MicroBatch]) -> list[MicroBatch]:
        if self._dp_size == 1:
            return plan
        ranks = assign_to_ranks(plan, self._dp_size)
        mine = ranks[self._dp_rank]
        # an empty micro-batch keeps the collective forward/backward count equal on all ranks
        return mine + [MicroBatch((), 1)] * (max(len(r) for r in ranks) - len(mine))

    def _collate(self, batch: TrainBatch, micro: MicroBatch) -> _Tensors:
        rows = len(micro.indices) or 1
        length = micro.padded_length
        ids = torch.zeros(rows, length, dtype=torch.long)
        mask = torch.zeros(rows, length, dtype=torch.long)
        behaviour = torch.zeros(rows, length, dtype=torch.float32)
        advantages = torch.zeros(rows, dtype=torch.float32)
        ref = None if batch.ref_logprobs is None else torch.zeros(rows, length)
        for row, i in enumerate(micro.indices):
            sample, advantage = batch.items[i]
            n = len(sample.input_ids)
            ids[row, :n] = torch.tensor(sample.input_ids)
            mask[row, :n] = torch.tensor(sample.loss_mask)
            behaviour[row, :n] = torch.tensor(sample.logprobs)
            advantages[row] = advantage
            if ref is not None and batch.ref_logprobs is not None:
                ref[row, :n] = torch.tensor(batch.ref_logprobs[i])
        packed = None
        if micro.packed_tokens is not None and micro.indices:
            packed = self._packed_row(batch, micro, length)
        return _Tensors(
            input_ids=ids.to(self.device),
            loss_mask=mask.to(self.device),
            behaviour=behaviour.to(self.device),
            advantages=advantages.to(self.device),
            ref=None if ref is None else ref.to(self.device),
            packed=packed,
        )

    def _packed_row(self, batch: TrainBatch, micro: MicroBatch, length: int) -> _PackedRow:
        samples = [batch.items[i][0] for i in micro.indices]
        row = pack([s.input_ids for s in samples], device=self.device)
        scored = torch.ones(row.tokens, dtype=torch.long)
        scored[list(row.starts)] = 0
        mask = torch.tensor([m for s in samples for m in s.loss_mask], dtype=torch.long)
        dest = torch.cat(
            [torch.arange(n) + r * length for r, n in enumerate(row.lengths)]
        )  # sequence r sits in row r of the padded layout, from column 0
        return _PackedRow(
            input_ids=row.input_ids,
            position_ids=row.position_ids,
            loss_mask=(mask * scored)[None].to(self.device),
            scored=scored[None].to(self.device),
            dest=dest.to(self.device),
        )

    def _micro_logprobs(self, tensors: _Tensors, *, train: bool) -> Tensor:
        """Logprobs [rows, length] of a collated micro-batch in the padded layout: where some
        row trains a token (`train`) or at every position. A packed row is run as one
        sequence and its logprobs scattered back (0.0 at padding, as the padded path has)."""
        row = tensors.packed
        if row is None:
            return self._logprobs(tensors.input_ids, tensors.loss_mask if train else None)
        lp = self._logprobs(
            row.input_ids, row.loss_mask if train else row.scored, position_ids=row.position_ids
        )[0]
        flat = torch.zeros(tensors.input_ids.numel(), dtype=lp.dtype, device=lp.device)
        return flat.index_copy(0, row.dest, lp).view(tensors.input_ids.shape)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._autocast_dtype)

    def _logprobs(
        self,
        input_ids: Tensor,
        loss_mask: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """Per-token logprobs [B, T] (position 0 is 0.0).

        With `loss_mask`, the LM head and log-softmax run only where some row trains a token
        (the other positions hold 0.0 and carry no gradient): the full-vocabulary logits are
        the largest activation of a small model and ~20% of its FLOPs, while only the
        completions (~20-40% of a multi-turn sequence) carry loss. `position_ids` (a packed
        row's) go to the model as they are.
        """
        targets = None if loss_mask is None else loss_mask[:, 1:].any(dim=0).nonzero().flatten() + 1
        if self.cp > 1:
            with self._autocast():
                return self._context_parallel_logprobs(input_ids, targets, position_ids)
        if self.settings.logits_chunk_tokens is not None:
            with self._autocast():
                return self._chunked_logprobs(input_ids, targets, position_ids)
        # logits_to_keep=0 keeps every position; 1 keeps one, for a micro-batch where nothing
        # trains (an all-masked sample, or FSDP's empty filler micro-batch)
        keep: int | Tensor = 0 if targets is None else (targets - 1 if targets.numel() else 1)
        with self._autocast():
            logits = self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                use_cache=False,
                logits_to_keep=keep,
            ).logits
        temperature = self.temperature
        if targets is None:
            return token_logprobs(logits, input_ids, temperature=temperature)
        if targets.numel() == 0:
            # zeros that stay on the graph, so the backward every rank runs is well-formed
            return torch.zeros(input_ids.shape, device=logits.device) + 0.0 * logits.float().sum()
        return kept_token_logprobs(logits, input_ids, targets, temperature=temperature)

    def _chunked_logprobs(
        self, input_ids: Tensor, targets: Tensor | None, position_ids: Tensor | None
    ) -> Tensor:
        """`_logprobs` with the LM head in chunks of `logits_chunk_tokens` kept positions.

        The whole model runs (so FSDP's root unit gathers the head and embeddings, and its
        backward hooks fire) with one logit position kept per row; a forward hook takes the
        decoder's final hidden states, whose kept positions then go through the head's weight
        by `chunked_token_logprobs` (temperature included). Under FSDP2 the root's parameters
        stay gathered after its forward, so the weight read here is the full one.
        """
        assert self._decoder is not None and self._head is not None
        if targets is None:
            targets = torch.arange(1, input_ids.shape[1], device=input_ids.device)
        captured: list[Tensor] = []

        def keep_hidden(_module: nn.Module, _inputs: Any, output: Any) -> None:
            captured.append(output[0])  # BaseModelOutputWithPast.last_hidden_state (or tuple)

        handle = self._decoder.register_forward_hook(keep_hidden)
        try:
            out = self.model(
                input_ids=input_ids, position_ids=position_ids, use_cache=False, logits_to_keep=1
            )
        finally:
            handle.remove()
        if targets.numel() == 0:
            return torch.zeros(input_ids.shape, device=out.logits.device) + 0.0 * out.logits.sum()
        (hidden,) = captured
        weight = self._head.weight
        if _is_dtensor(weight):
            raise RuntimeError(
                "trainer.logits_chunk_tokens: the LM head's weight is still sharded after the "
                "model's forward (FSDP resharded its root unit); set logits_chunk_tokens: null"
            )
        rows, kept = input_ids.shape[0], targets.numel()
        logprobs, _ = chunked_token_logprobs(
            hidden[:, targets - 1].reshape(rows * kept, -1),
            weight,
            input_ids[:, targets].reshape(-1),
            chunk_tokens=self.settings.logits_chunk_tokens or kept,
            temperature=self.temperature,
        )
        full = torch.zeros(input_ids.shape, dtype=logprobs.dtype, device=logprobs.device)
        return full.index_copy(1, targets, logprobs.view(rows, kept))

    def _context_parallel_logprobs(
        self, input_ids: Tensor, targets: Tensor | None, position_ids: Tensor | None
    ) -> Tensor:
        """`_logprobs` with this rank holding one chunk of the tokens (`context_parallel`).

        The model runs on the chunk (global positions, attention over the whole sequence by
        all-to-alls in its group, left active until the caller's backward is done), its final
        hidden states at the positions predicting a column of `targets` (every column without
        them) go through the LM head in chunks of `logits_chunk_tokens` (all at once without
        it), and the group's chunks of next-token logprobs are gathered into the whole [B, T]
        row on every rank; other columns hold 0.0, as in `_logprobs`. A rank with no such
        position still keeps its chunk's forward on the graph: its backward must run the same
        all-to-alls as the others'.
        """
        assert self._decoder is not None and self._head is not None
        chunk = context_parallel.split(input_ids, position_ids, self.cp, self._cp_rank)
        context_parallel.activate(self._cp_group, chunk.segments)
        captured: list[Tensor] = []

        def keep_hidden(_module: nn.Module, _inputs: Any, output: Any) -> None:
            captured.append(output[0])

        handle = self._decoder.register_forward_hook(keep_hidden)
        try:
            self.model(
                input_ids=chunk.input_ids,
                position_ids=chunk.position_ids,
                use_cache=False,
                logits_to_keep=1,
            )
        finally:
            handle.remove()
        (hidden,) = captured
        weight = self._head.weight
        if _is_dtensor(weight):
            raise RuntimeError(
                "trainer.context_parallel: the LM head's weight is still sharded after the "
                "model's forward (FSDP resharded its root unit)"
            )
        rows, width = chunk.input_ids.shape
        # the chunk's positions whose next token is a kept column (all rows share the columns)
        wanted = torch.zeros(chunk.padded_length + 1, dtype=torch.bool, device=hidden.device)
        wanted[1 : chunk.length] = True
        if targets is not None:
            wanted[1 : chunk.length] = False
            wanted[targets] = True
        first = self._cp_rank * width
        columns = wanted[first + 1 : first + width + 1].nonzero().flatten()
        lp = hidden.new_zeros((rows, width), dtype=torch.float32) + 0.0 * hidden.sum()
        if columns.numel():
            kept = columns.numel()
            values, _ = chunked_token_logprobs(
                hidden[:, columns].reshape(rows * kept, -1),
                weight,
                chunk.targets[:, columns].reshape(-1),
                chunk_tokens=self.settings.logits_chunk_tokens or rows * kept,
                temperature=self.temperature,
            )
            lp = lp.index_copy(1, columns, values.view(rows, kept))
        whole = context_parallel.gather_sequence(lp, self._cp_group, self._cp_rank)
        return context_parallel.next_token_to_token(whole, chunk.length)

    def _check_context_parallel(self) -> None:
        """Refuse a model on which the split forward is not the whole one (an attention that
        ignores transformers' attention interface would attend within each chunk only): the
        logprobs of a probe sequence split over the group must equal its unsplit ones."""
        ids = _probe_ids(self.model, (3, 7), 4 * self.cp + 1)[None].to(self.device)
        with _evaluating(self.model), torch.no_grad():
            logits = self.model(input_ids=ids, use_cache=False).logits
            expected = token_logprobs(logits, ids, temperature=self.temperature)
            try:
                got = self._context_parallel_logprobs(ids, None, None)
            finally:
                context_parallel.deactivate()
        diff = float((got - expected).abs().max())
        if not diff <= 1e-3:
            attention = getattr(self.model.config, "_attn_implementation", "?")
            raise ValueError(
                f"trainer.context_parallel: {type(self.model).__name__} (attention "
                f"{attention!r}) does not attend across the chunks of a split sequence (a "
                f"probe's logprobs split over {self.cp} ranks differ from its own by "
                f"{diff:.2e}); set context_parallel: 1"
            )

    def _check_chunked_head(self) -> None:
        """Refuse a model whose logits are not `hidden @ lm_head.weight.T` (a bias, logit
        scaling or softcapping): chunked logprobs of a probe sequence must equal its own."""
        ids = _probe_ids(self.model, (3, 7), 9)[None].to(self.device)
        with _evaluating(self.model), torch.no_grad():
            logits = self.model(input_ids=ids, use_cache=False).logits
            expected = token_logprobs(logits, ids, temperature=self.temperature)
            got = self._chunked_logprobs(ids, None, None)
        diff = float((got - expected).abs().max())
        if not diff <= 1e-3:
            raise ValueError(
                f"trainer.logits_chunk_tokens: {type(self.model).__name__}'s logits are not "
                f"its final hidden states times the LM head's weight (chunked logprobs differ "
                f"from its own by {diff:.2e} on a probe); set logits_chunk_tokens: null"
            )

    def _check_packing(self) -> None:
        """Refuse a model that lets a packed row's sequences see each other: the logprobs of a
        probe sequence packed after another must equal those of it alone."""
        first, second = _probe_ids(self.model, (3, 7), 7), _probe_ids(self.model, (5, 11), 6)
        row = pack([first.tolist(), second.tolist()], device=self.device)
        alone = second[None].to(self.device)
        with _evaluating(self.model), torch.no_grad():
            packed = self.model(
                input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False
            ).logits[:, first.numel() :]
            expected = self.model(input_ids=alone, use_cache=False).logits
        diff = float((packed.log_softmax(-1) - expected.log_softmax(-1)).abs().max())
        if not diff <= 1e-3:
            attention = getattr(self.model.config, "_attn_implementation", "?")
            raise ValueError(
                f"trainer.packing: {type(self.model).__name__} (attention {attention!r}) lets "
                f"the sequences of a packed row attend to each other (a sequence's logprobs "
                f"packed after another differ from its own by {diff:.2e}); set packing: false"
            )

    def _clip_gradients(self) -> float:
        max_norm = self.settings.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(
            self._params, max_norm if max_norm is not None else math.inf
        )
        value = float(full_tensor(norm))
        if not math.isfinite(value):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"gradient norm is {value}; the update was not applied (check the loss inputs)"
            )
        return value


def token_logprobs(logits: Tensor, input_ids: Tensor, *, temperature: float = 1.0) -> Tensor:
    """`conveyor.trainer.losses.sequence_logprobs`, computed by the fused cross-entropy kernel.

    Same values (tests/trainer/test_engine.py checks it) at about a third of the time and
    memory traffic on [B, T, V] logits: no shifted copy of the logits (the targets shift
    instead, the last position gets ignore_index) and one fused log-softmax + gather, forward
    and backward. In a train step that difference was ~10% of the step time of the 135M model.
    """
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be [B, T, V] for input_ids "
            f"{tuple(input_ids.shape)} [B, T]"
        )
    targets = nn.functional.pad(input_ids[:, 1:], (0, 1), value=-100)
    nll = _nll(logits, targets, temperature)
    # position t holds the logprob of token t, predicted at t - 1; position 0 has none
    return nn.functional.pad(-nll[:, :-1], (1, 0), value=0.0)


def kept_token_logprobs(
    logits: Tensor, input_ids: Tensor, targets: Tensor, *, temperature: float = 1.0
) -> Tensor:
    """`token_logprobs` from logits kept only at positions `targets - 1`.

    `logits` is [B, K, V] for the K positions `targets - 1` (sorted, >= 0); the result is the
    full [B, T] logprob tensor with the logprob of token `targets[k]` at column `targets[k]`
    and 0.0 (no gradient) at every other column.
    """
    if logits.dim() != 3 or logits.shape[:2] != (input_ids.shape[0], targets.numel()):
        raise ValueError(
            f"logits {tuple(logits.shape)} must be [B, K, V] for input_ids "
            f"{tuple(input_ids.shape)} and {targets.numel()} kept positions"
        )
    nll = _nll(logits, input_ids[:, targets], temperature)
    full = torch.zeros(input_ids.shape, dtype=nll.dtype, device=nll.device)
    return full.index_copy(1, targets, -nll)


def _nll(logits: Tensor, targets: Tensor, temperature: float) -> Tensor:
    """-log softmax(logits / temperature) at `targets` ([B, K, V] x [B, K] -> [B, K]), in at
    least float32, by the fused cross-entropy kernel (target -100: 0.0)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        logits = logits / temperature
    nll = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    )
    return nll.view(targets.shape)


def _is_dtensor(tensor: Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def _probe_ids(model: nn.Module, step: tuple[int, int], n: int) -> Tensor:
    """`n` deterministic token ids spread over the vocabulary (no RNG drawn)."""
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab <= 0:
        raise ValueError(f"{type(model).__name__} has no config.vocab_size")
    a, b = step
    return torch.tensor([(a + b * 1009 * k) % vocab for k in range(n)], dtype=torch.long)


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Linear]:
    """The decoder (whose output is the final hidden states) and the LM head of a HF causal
    LM, through a peft wrapper; refuses a head that is not a plain bias-free Linear (LoRA on
    `lm_head`: its adapter would be left out)."""
    get_decoder: Any = getattr(model, "get_decoder", None)
    get_head: Any = getattr(model, "get_output_embeddings", None)
    decoder = get_decoder() if callable(get_decoder) else None
    head = get_head() if callable(get_head) else None
    if not isinstance(decoder, nn.Module) or head is None:
        raise ValueError(
            f"trainer.logits_chunk_tokens needs a causal LM with get_decoder() and "
            f"get_output_embeddings(); {type(model).__name__} has not both"
        )
    if type(head) is not nn.Linear or head.bias is not None:
        raise ValueError(
            f"trainer.logits_chunk_tokens needs the LM head to be a plain bias-free Linear; "
            f"{type(model).__name__}'s is {type(head).__name__}"
            + (" with a bias" if getattr(head, "bias", None) is not None else "")
            + " (LoRA on lm_head is not supported with chunked logits)"
        )
    return decoder, head


def _micro_weight(reduction: str, micro: MicroBatch, counts: Sequence[int]) -> float:
    """Micro-batch k's numerator of its share of the batch denominator (module docstring)."""
    if reduction == "token_mean":
        return float(sum(counts[i] for i in micro.indices))
    if reduction == "seq_mean_token_mean":
        return float(sum(1 for i in micro.indices if counts[i]))
    return float(len(micro.indices))


def _sharded_load(model_dir: Path | str, settings: TrainerConfig, requested: bool | None) -> bool:
    """Whether to load shard by shard (`TorchTrainingEngine`'s docstring says when)."""
    if requested is not None:
        if requested and not settings.fsdp:
            raise ValueError("a sharded load needs fsdp: true (the shards are FSDP's)")
        if requested and settings.lora.enabled:
            raise ValueError("a sharded load does not support LoRA (adapters initialise in full)")
        return requested
    if not settings.fsdp or settings.lora.enabled:
        return False
    if safetensors_index(model_dir) is None:
        warnings.warn(
            f"{model_dir} has no safetensors checkpoint: every FSDP rank loads the whole model "
            "before sharding it",
            stacklevel=3,
        )
        return False
    return True


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 in hardware (autocast to it is then faster, not slower)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        if os.environ.get("CONVEYOR_NO_BF16", "") not in ("", "0"):
            # timing runs "with bf16 off" on a bf16-capable CPU: `dtype: auto` trains in
            # float32, as on an AVX2-only machine (vLLM-CPU serves float32 either way)
            return False
        # Without AVX512-BF16 or AMX, CPU bf16 matmuls are emulated: one 512-token
        # forward/backward of the embedded model took 262 s against 17 s in float32 (AVX2 EPYC).
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return False


def _autocast_dtype(settings: TrainerConfig, device: torch.device) -> torch.dtype | None:
    if settings.dtype == "float32":
        return None
    native = native_bf16(device)
    if settings.dtype == "auto":
        return torch.bfloat16 if native else None
    if device.type == "cuda" and not native:
        raise ValueError(f"dtype bfloat16 requested but {device} does not support bf16")
    if device.type == "cpu" and not native:
        warnings.warn(
            "trainer.dtype bfloat16 on a CPU without AVX512-BF16 or AMX: bf16 autocast is "
            "emulated there and about 15x slower than float32; trainer.dtype auto picks float32",
            stacklevel=2,
        )
    if not torch.amp.autocast_mode.is_autocast_available(device.type):
        raise ValueError(f"dtype bfloat16 requested but autocast is unavailable on {device}")
    return torch.bfloat16


def _decoder_blocks(model: nn.Module, last: int) -> tuple[nn.Module, str, nn.ModuleList]:
    """(decoder, the attribute naming its blocks, the blocks) of a HF causal LM; `last` checked."""
    get_decoder: Any = getattr(model, "get_decoder", None)
    decoder: Any = get_decoder() if callable(get_decoder) else None
    blocks = [
        (name, child)
        for name, child in (decoder.named_children() if decoder is not None else [])
        if isinstance(child, nn.ModuleList)
    ]
    if decoder is None or len(blocks) != 1:
        raise ValueError(
            "trainer.train_last_layers needs a decoder with one list of blocks "
            f"(model.get_decoder().layers); {type(model).__name__} has none"
        )
    name, layers = blocks[0]
    if last > len(layers):
        raise ValueError(
            f"trainer.train_last_layers={last} but the model has {len(layers)} decoder blocks"
        )
    return decoder, name, layers


def _freeze_below(model: nn.Module, last: int) -> None:
    """Only the last `last` blocks and the decoder's final norm keep `requires_grad`."""
    decoder, blocks_name, layers = _decoder_blocks(model, last)
    model.requires_grad_(False)
    for block in list(layers)[-last:]:
        block.requires_grad_(True)
    for name, child in decoder.named_children():
        if name != blocks_name and not isinstance(child, nn.Embedding):
            child.requires_grad_(True)  # the final norm (rotary tables hold no parameters)


def _add_lora(model: nn.Module, lora: LoraConfig, last: int | None = None) -> nn.Module:
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    where: dict[str, Any] = {}
    if last is not None:
        _, blocks_name, layers = _decoder_blocks(model, last)
        where = {
            "layers_to_transform": list(range(len(layers) - last, len(layers))),
            "layers_pattern": blocks_name,
        }
    config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft only divides by r
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
        **where,
    )
    return get_peft_model(model, config)  # type: ignore[arg-type]


def _merged_lora_weights(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """Base weights plus each adapter's delta, under the base model's own names."""
    from peft.tuners.lora import LoraLayer

    base: Any = model.base_model.model  # type: ignore[union-attr]
    deltas: dict[str, Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            layer: Any = module
            delta = [layer.get_delta_weight(adapter) for adapter in layer.active_adapters]
            deltas[f"{name}.base_layer.weight"] = torch.stack(delta).sum(0)
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        value = full_tensor(tensor).detach()
        if name in deltas:
            value = value + full_tensor(deltas[name]).detach()
        yield name.replace(".base_layer.", "."), value
