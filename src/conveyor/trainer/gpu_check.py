"""The trainer-side GPU check (scripts/gpu-check.sh): bf16 train steps of a random
Qwen3-shaped model at long context, packed against padded, chunked against full logits.

Runs on the GPU machine we are sometimes lent (torch, transformers and peft; no vLLM, Ray,
pydantic or network), so it imports only torch, transformers and conveyor's torch-only trainer
pieces (`trainer.packing`, `trainer.chunked`). Nothing is downloaded: the model is built from a
config with random weights. Each case reports tokens/s (real tokens, padding excluded), peak
device memory and the memory `conveyor plan`'s trainer model (`trainer.memory`) predicts for
it; an exactness section compares packed with padded and chunked with full logprobs in float32
on the same device.

    python -m conveyor.trainer.gpu_check --shape qwen3-1.7b --tokens 8192,32768 --out r.json
    python -m conveyor.trainer.gpu_check --shape tiny --device cpu      (what the CPU test runs)

The last line printed is the JSON report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import random
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from conveyor.trainer.chunked import chunked_token_logprobs, full_token_logprobs
from conveyor.trainer.memory import Architecture, trainer_memory
from conveyor.trainer.packing import pack, packed_targets, pad, padding_fraction

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen3-1.7B's published architecture (config.json of Qwen/Qwen3-1.7B)
    "qwen3-1.7b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    # flex attention's kernels want head_dim >= 64 in float32 on a GPU
    "small": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=1000,
        max_position_embeddings=8192,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=1000,
        max_position_embeddings=8192,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}


@dataclass
class Case:
    tokens: int
    layout: str  # "packed" | "padded"
    logits: str  # "chunked" | "full"
    sequences: int = 0
    real_tokens: int = 0
    processed_tokens: int = 0
    padding_fraction: float = 0.0
    step_s: list[float] | None = None
    tok_s: float | None = None
    peak_gib: float | None = None
    predicted_gib: float | None = None
    loss: float | None = None
    error: str | None = None


def build_model(
    shape: str, device: torch.device, dtype: torch.dtype, attn: str = "sdpa"
) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(**SHAPES[shape])
    config.use_cache = False
    torch.manual_seed(0)
    with device:
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
        except TypeError:  # transformers < 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_config(
                config, torch_dtype=dtype, attn_implementation=attn
            )
    return model.to(device)


def lengths_for(tokens: int, seed: int) -> list[int]:
    """Multi-turn trajectory lengths that sum to exactly `tokens` (between 1/16 and 1/3 of it)."""
    rng = random.Random(seed)
    out: list[int] = []
    while sum(out) < tokens:
        out.append(rng.randint(max(2, tokens // 16), max(3, tokens // 3)))
    out[-1] -= sum(out) - tokens
    if out[-1] < 2:
        out[-2] += out.pop()
    return out


def _selected(
    hidden: Tensor, ids: Tensor, rows: Sequence[int], positions: Tensor
) -> tuple[Tensor, Tensor]:
    """Hidden states predicting (row, position) tokens, and those tokens."""
    rows_t = torch.as_tensor(rows, device=hidden.device)
    return hidden[rows_t, positions - 1], ids[rows_t, positions]


def logprobs_of(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    layout: str,
    logits: str,
    chunk_tokens: int,
    device: torch.device,
) -> tuple[Tensor, int]:
    """Logprobs of every token but each sequence's first, in sequence order; and the number
    of positions the model processed (padding included)."""
    base: Any = getattr(model, "get_base_model", lambda: model)()  # a peft model's base
    head: Tensor = base.lm_head.weight
    if layout == "packed":
        packed = pack(sequences, device=device)
        hidden = base.model(
            input_ids=packed.input_ids, position_ids=packed.position_ids
        ).last_hidden_state
        positions = packed_targets(packed)
        h, targets = _selected(hidden, packed.input_ids, [0] * positions.numel(), positions)
        processed = packed.tokens
    else:
        ids, mask = pad(sequences, device=device)
        hidden = base.model(input_ids=ids, attention_mask=mask).last_hidden_state
        rows: list[int] = []
        cols: list[int] = []
        for row, seq in enumerate(sequences):
            rows.extend([row] * (len(seq) - 1))
            cols.extend(range(1, len(seq)))
        h, targets = _selected(hidden, ids, rows, torch.tensor(cols, device=device))
        processed = ids.numel()
    if logits == "chunked":
        lp, _ = chunked_token_logprobs(h, head, targets, chunk_tokens=chunk_tokens)
    else:
        lp, _ = full_token_logprobs(h, head, targets)
    return lp, processed


def predicted_bytes(
    shape: str,
    params: int,
    real: int,
    layout: str,
    logits: str,
    rows: int,
    row_length: int,
    chunk_tokens: int,
    sequences: int,
    dense_mask: bool = True,
    param_bytes: int = 2,
    autocast: bool = False,
) -> int:
    """`conveyor plan`'s trainer estimate (`trainer.memory.trainer_memory`) for this check's
    setup: bf16 weights, gradients and AdamW moments (8 bytes a parameter), per-layer
    checkpointing, `rows` x `row_length` positions a pass, logits for every token but each
    sequence's first, whole or in `chunk_tokens` chunks; a dense mask under sdpa, none under
    flex attention. `params` is the model's count, which the architecture gives as well.
    `param_bytes` 4 with `autocast`: float32 weights and AdamW state under bf16 autocast (the
    built-in trainer's precision, `--dtype float32 --autocast`).
    """
    arch = Architecture.from_config({**SHAPES[shape], "model_type": "qwen3"})
    parts = trainer_memory(
        arch,
        tokens=rows * row_length,
        rows=rows,
        param_bytes=param_bytes,
        autocast=autocast,
        checkpointing=True,
        logits_chunk_tokens=chunk_tokens if logits == "chunked" else None,
        logit_positions=real - sequences,
        dense_mask=dense_mask,
    )
    return parts["total"]


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_case(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    case: Case,
    shape: str,
    params: int,
    device: torch.device,
    steps: int,
    warmup: int,
    chunk_tokens: int,
    seed: int,
    attn: str = "sdpa",
    autocast: bool = False,
) -> Case:
    lengths = lengths_for(case.tokens, seed)
    rng = random.Random(seed + 1)
    vocab = SHAPES[shape]["vocab_size"]
    sequences = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
    advantages = [rng.choice((-1.0, 1.0)) for _ in lengths]
    case.sequences = len(lengths)
    case.real_tokens = sum(lengths)
    rows, row_length = (
        (1, sum(lengths)) if case.layout == "packed" else (len(lengths), max(lengths))
    )
    case.processed_tokens = rows * row_length
    case.padding_fraction = round(padding_fraction(lengths, rows, row_length), 4)
    case.predicted_gib = round(
        predicted_bytes(
            shape,
            params,
            case.real_tokens,
            case.layout,
            case.logits,
            rows,
            row_length,
            chunk_tokens,
            len(lengths),
            dense_mask=attn == "sdpa",
            param_bytes=next(model.parameters()).element_size(),
            autocast=autocast,
        )
        / 2**30,
        3,
    )
    weights = torch.tensor(
        [a for a, n in zip(advantages, lengths, strict=True) for _ in range(n - 1)], device=device
    )
    times: list[float] = []
    _peak_reset(device)
    try:
        for i in range(warmup + steps):
            _sync(device)
            start = time.perf_counter()
            with (
                torch.autocast(device.type, dtype=torch.bfloat16)
                if autocast
                else contextlib.nullcontext()
            ):
                lp, _ = logprobs_of(
                    model, sequences, case.layout, case.logits, chunk_tokens, device
                )
                loss = -(lp.float() * weights).sum() / lp.numel()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            _sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - start)
            case.loss = float(loss.detach())
    except torch.OutOfMemoryError as exc:
        case.error = f"out of memory: {str(exc).splitlines()[0][:200]}"
        optimizer.zero_grad(set_to_none=True)
    peak = _peak_gib(device)
    case.peak_gib = None if peak is None else round(peak, 3)
    if times:
        case.step_s = [round(t, 4) for t in times]
        median = sorted(times)[len(times) // 2]
        case.tok_s = round(case.real_tokens / median, 1)
    return case


def exactness(device: torch.device, attn: str = "sdpa") -> dict[str, Any]:
    """Packed vs padded and chunked vs full logprobs, float32, on this device (tiny model)."""
    matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        model = build_model("tiny" if attn == "sdpa" else "small", device, torch.float32, attn)
        model.eval()
        rng = random.Random(7)
        # the longest row past 128 positions: shorter queries take flex attention's decoding kernel,
        # which has no float32 variant on an H200 (measured)
        seqs = [[rng.randrange(1000) for _ in range(n)] for n in (137, 300, 64, 9)]
        with torch.no_grad():
            padded, _ = logprobs_of(model, seqs, "padded", "full", 64, device)
            packed, _ = logprobs_of(model, seqs, "packed", "full", 64, device)
            chunked, _ = logprobs_of(model, seqs, "packed", "chunked", 16, device)
        return {
            "packed_vs_padded_max_abs": float((packed - padded).abs().max()),
            "chunked_vs_full_max_abs": float((chunked - packed).abs().max()),
        }
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            card=props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
        )
    else:
        env["card"] = platform.processor() or "cpu"
    return env


def main(
    argv: Sequence[str] | None = None, *, emit: Callable[[str], None] = print
) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m conveyor.trainer.gpu_check", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-1.7b")
    parser.add_argument("--tokens", default="8192,32768", help="comma-separated tokens per step")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per case")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--chunk-tokens", type=int, default=4096)
    parser.add_argument(
        "--attn",
        choices=("sdpa", "flex_attention"),
        default="sdpa",
        help="attention kernel: sdpa runs packed rows with a dense [N, N] mask, "
        "flex_attention with a block mask that skips other sequences' blocks",
    )
    parser.add_argument(
        "--autocast",
        action="store_true",
        help="forward under bf16 autocast (with --dtype float32: the built-in trainer's "
        "float32 weights and AdamW state)",
    )
    parser.add_argument("--layouts", default="packed,padded")
    parser.add_argument("--logits", default="chunked,full")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="skip the cases left once this much time has passed",
    )
    parser.add_argument("--out", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    begun = time.perf_counter()
    report: dict[str, Any] = {
        "environment": environment(device),
        "shape": args.shape,
        "dtype": args.dtype,
        "autocast": args.autocast,
        "attn": args.attn,
        "chunk_tokens": args.chunk_tokens,
    }
    try:
        report["exactness_float32"] = exactness(device, args.attn)
    except Exception as exc:  # a kernel that cannot run here is reported, the timings still run
        report["exactness_float32"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    emit(f"exactness: {report['exactness_float32']}")
    model: Any = build_model(args.shape, device, dtype, args.attn)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = sum(p.numel() for p in model.parameters())
    report["parameters"] = params
    report["build_s"] = round(time.perf_counter() - begun, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=False)
    cases: list[Case] = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for layout in args.layouts.split(","):
            for logits in args.logits.split(","):
                case = Case(tokens=tokens, layout=layout, logits=logits)
                if time.perf_counter() - begun > args.budget_s:
                    case.error = "skipped: time budget spent"
                else:
                    run_case(
                        model,
                        optimizer,
                        case,
                        args.shape,
                        params,
                        device,
                        args.steps,
                        args.warmup,
                        args.chunk_tokens,
                        seed=tokens,
                        attn=args.attn,
                        autocast=args.autocast,
                    )
                cases.append(case)
                emit(
                    f"case {tokens} {layout:6} {logits:7}: tok/s {case.tok_s} peak "
                    f"{case.peak_gib} GiB predicted {case.predicted_gib} GiB {case.error or ''}"
                )
    report["cases"] = [asdict(c) for c in cases]
    report["max_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    report["wall_s"] = round(time.perf_counter() - begun, 1)
    text = json.dumps(report)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")
    emit(text)
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
