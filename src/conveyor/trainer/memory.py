"""The trainer's memory on one device, from the model's architecture (`conveyor plan`).

Pure Python, standard library only: the GPU check (`trainer.gpu_check`, torch and transformers
only) and the planner both call `trainer_memory`. Everything is in bytes; a device's share is
the whole model's divided by the FSDP sharding degree (`shards`) for the state, and the
micro-batch's for the activations (each rank runs its own micro-batch).

What is counted (docs/scale.md, "Memory plan"):

- **State**: parameters, gradients and AdamW's two moments, each in the parameters' dtype
  (torch keeps gradients and moments in it): 16 bytes a parameter for float32 (the built-in
  trainer), 8 for bfloat16 (the GPU check). Only trainable parameters have gradients and
  moments (LoRA, `trainer.train_last_layers`).
- **Loading** adds nothing above that state under FSDP: each rank builds the model on the
  meta device and reads only its shard from the safetensors files (`trainer/sharded_load.py`;
  docs/scale.md, "Sharded load and one-box FSDP"). Not counted: the full-load path (LoRA under
  FSDP, a checkpoint without safetensors) holds a whole float32 copy on every rank while it
  shards it, 4 bytes a parameter on top of the shard, before gradients and moments exist.
- **Autocast copies**: float32 parameters under bf16 autocast (the built-in trainer) are cast
  once per forward and autocast keeps every cast until the forward ends: 2 bytes a parameter.
- **Activations** at `tokens` positions a pass. With per-layer checkpointing: each layer's
  input (the residual stream: float32 when the parameters are, bf16 otherwise) and one
  layer's recomputed working set, `WORKING_SET_HIDDEN` hidden + `WORKING_SET_INTERMEDIATE`
  intermediate vectors a position (fitted, below). Without: every layer keeps its inputs for
  backward (norm in/out, q, k, v, attention out, MLP's four intermediate vectors; not fitted).
- **Context parallelism** (`context_parallel` ranks share a pass, each holding one chunk of
  its tokens, `trainer/context_parallel.py`): every per-token activation and the logits are
  those of `tokens / context_parallel` positions (the chunk's logits are computed at every
  position). The dense mask of a packed row is not divided: Ulysses attention runs over the
  whole row for a share of the heads, and the mask covers the whole row.
- **Attention mask**: with sdpa and a mask (right-padded rows, or packed rows under a dense
  mask), `MASK_BYTES_PER_PAIR` bytes for each (query, key) pair of a row; none with a kernel
  that takes no dense mask (flex attention's block mask, flash-attention varlen).
- **Logits**: the LM head's output for every kept position, or one chunk of them when the
  logprobs are computed in chunks: `LOGIT_BYTES_FULL` or `LOGIT_BYTES_CHUNKED` bytes a
  vocabulary entry (bf16 matmul output, its float32 copy, the cross-entropy gradient).

The four fitted constants come from the H200 measurements of the GPU check (a random
Qwen3-1.7B shape, bf16 parameters and AdamW, checkpointing, 8k-64k tokens, packed and padded,
sdpa and flex attention, 4,096-token logit chunks or none; docs/data/gpu-check-h200-*.json):
every one of the twelve measured peaks is predicted within 6% (tests/trainer/test_memory_model.py
holds them to 20%). The summed components are an upper bound of a peak that is really a
maximum over the step's phases. The float32-with-autocast case (the built-in trainer),
measured afterwards on the same card at 8k-16k tokens, is over-predicted by 9-19%; on CPU the
built-in trainer's peak RSS (less the process's own) by `conveyor bench trainer` came within
6-15% (docs/scale.md, "Memory plan"). Training without checkpointing is not measured on a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 2**30

# fitted on the H200 GPU check (module doc)
WORKING_SET_HIDDEN = 6
WORKING_SET_INTERMEDIATE = 1
LOGIT_BYTES_FULL = 10.0
LOGIT_BYTES_CHUNKED = 5.5
MASK_BYTES_PER_PAIR = 3

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Architecture:
    """The shape of a decoder-only transformer (Llama / Qwen family), from its config.json."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qk_norm: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Architecture:
        """From a Hugging Face config.json's fields; a missing required field is a KeyError
        naming it."""
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "vocab_size",
        ):
            if not isinstance(config.get(name), int):
                raise KeyError(f"config.json has no integer {name!r}")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            hidden=hidden,
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)),
            qk_norm=config.get("model_type") in ("qwen3", "qwen3_moe"),
        )

    def layer_parameters(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return attention + 3 * h * self.intermediate + norms

    def parameters(self) -> int:
        embeddings = self.vocab * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        return embeddings + head + self.layers * self.layer_parameters() + self.hidden

    def lora_parameters(self, rank: int, modules: list[str] | tuple[str, ...]) -> int:
        """Adapter parameters of LoRA rank `rank` on the named projections of every layer."""
        h, q, kv, i = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        shapes = {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }
        per_layer = sum(rank * sum(shapes[m]) for m in modules if m in shapes)
        return self.layers * per_layer

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes one token takes in an engine (keys and values of every layer)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def trainer_memory(
    arch: Architecture,
    *,
    tokens: int,
    rows: int = 1,
    param_bytes: int = 4,
    autocast: bool = True,
    shards: int = 1,
    trainable: int | None = None,
    checkpointing: bool = True,
    logits_chunk_tokens: int | None = None,
    logit_positions: int | None = None,
    dense_mask: bool = True,
    context_parallel: int = 1,
) -> dict[str, int]:
    """Bytes one trainer device holds at the peak of a step, by component (module doc).

    `tokens` positions a pass in `rows` rows of equal length (padding included);
    `param_bytes` the parameters' dtype (4: float32, 2: bfloat16), `autocast` whether they are
    cast to bf16 for the forward; `shards` the FSDP degree; `trainable` the parameters that
    train (None: all); `logits_chunk_tokens` the logprob chunk (None: the whole pass);
    `logit_positions` the positions whose logits are computed (None: all of `tokens`);
    `dense_mask` whether attention gets a dense [L, L] mask (sdpa) or none (flex, varlen);
    `context_parallel` the ranks one pass's tokens are split over.
    """
    if tokens <= 0 or rows <= 0 or shards <= 0 or context_parallel <= 0:
        raise ValueError("tokens, rows, shards and context_parallel must be positive")
    pass_tokens = tokens
    tokens = -(-tokens // context_parallel)  # this rank's chunk of the pass
    params = arch.parameters()
    trained = params if trainable is None else trainable
    h, i = arch.hidden, arch.intermediate
    act_bytes = param_bytes if param_bytes == 4 and not autocast else 2
    residual_bytes = param_bytes  # the residual stream stays in the parameters' dtype
    if checkpointing:
        saved = arch.layers * tokens * h * residual_bytes
        work = tokens * (WORKING_SET_HIDDEN * h + WORKING_SET_INTERMEDIATE * i) * act_bytes
        activations = saved + work
    else:
        q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
        per_layer = (5 * h + 2 * q + 2 * kv + 4 * i) * act_bytes + h * residual_bytes
        activations = arch.layers * tokens * per_layer
    row_length = -(-pass_tokens // rows)
    mask = MASK_BYTES_PER_PAIR * rows * row_length * row_length if dense_mask else 0
    positions = tokens if logit_positions is None or context_parallel > 1 else logit_positions
    if logits_chunk_tokens:
        logits = int(min(positions, logits_chunk_tokens) * arch.vocab * LOGIT_BYTES_CHUNKED)
    else:
        logits = int(positions * arch.vocab * LOGIT_BYTES_FULL)
    parts = {
        "parameters": params * param_bytes // shards,
        "gradients": trained * param_bytes // shards,
        "optimizer": 2 * trained * param_bytes // shards,
        "autocast_copies": (2 * params // shards) if autocast and param_bytes == 4 else 0,
        "activations": activations,
        "attention_mask": mask,
        "logits": logits,
    }
    parts["total"] = sum(parts.values())
    return parts
