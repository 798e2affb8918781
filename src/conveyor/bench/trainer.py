"""`conveyor bench trainer`: the training engine against a plain transformers loop.

Both sides train the same model on the same synthetic batch, split by the same micro-batch plan
(`conveyor.trainer.batching`) with the same right padding, and both clip the gradient norm and
step AdamW:

- engine: `TorchTrainingEngine.step` (policy loss, logprob probe, metrics, LR schedule);
- baseline: per micro-batch `model(input_ids, attention_mask, labels).loss` (the Hugging Face
  causal-LM cross-entropy over loss-masked tokens) weighted by its token share, `backward`, then
  `clip_grad_norm_` and `AdamW.step`: the loop people write by hand.

Each side runs in its own spawned process (so peak memory is its own), and the parent alternates
single steps between them, swapping the order every step, so drift in machine load hits both
alike. After warm-up, the median step time of `steps` steps gives tokens/s (real, not padding,
tokens) and `ratio`; on a shared machine `paired_ratio_median` (median over steps of baseline
time / engine time of the adjacent pair) is the steadier number. Peak memory: the process's
max RSS on CPU, `torch.cuda.max_memory_allocated` on GPU. The last printed line is one JSON
object.
"""

from __future__ import annotations

import os
import random
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from conveyor.trainer.backend import TrainBatch
from conveyor.trainer.batching import plan_micro_batches
from conveyor.types import TrainingSample

SIDES = ("engine", "baseline")


@dataclass(frozen=True)
class TrainerBenchSpec:
    """What to measure: model folder, batch shape, budget and step counts."""

    model_dir: str
    batch_size: int = 4
    seq_len: int = 256
    micro_batch_tokens: int = 512
    steps: int = 10
    warmup: int = 2
    seed: int = 0
    threads: int | None = None  # torch intra-op threads per side; None: all cores
    # trainer settings of the engine side (TrainerConfig keys, nested as dicts), e.g.
    # {"lora": {"enabled": True}} or {"train_last_layers": 4}
    engine_settings: dict[str, Any] = field(default_factory=dict)
    # "plain": the hand-written transformers loop; "engine": the engine with default settings
    # (full fine-tuning), so `engine_settings` are measured against full fine-tuning
    baseline: str = "plain"


def synthetic_batch(spec: TrainerBenchSpec, vocab_size: int) -> TrainBatch:
    """Lengths in [3/4, 1] x seq_len (so padding happens), a masked quarter-length prompt,
    random tokens, behaviour logprobs and advantages; seeded."""
    rng = random.Random(spec.seed)
    items = []
    for _ in range(spec.batch_size):
        length = rng.randint(max(2, spec.seq_len * 3 // 4), spec.seq_len)
        prompt = max(1, length // 4)
        mask = [0] * prompt + [1] * (length - prompt)
        sample = TrainingSample(
            input_ids=[rng.randrange(vocab_size) for _ in range(length)],
            loss_mask=mask,
            logprobs=[-rng.uniform(0.1, 5.0) if m else 0.0 for m in mask],
            prompt_length=prompt,
        )
        items.append((sample, rng.choice([-1.0, 1.0])))
    return TrainBatch(items=items)


def run_trainer_bench(spec: TrainerBenchSpec) -> dict[str, Any]:
    """Measure both sides, interleaved step by step; returns the JSON report."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    pipes: dict[str, Connection] = {}
    procs = []
    for side in SIDES:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(side, spec, child), daemon=True)
        proc.start()
        pipes[side] = parent
        procs.append(proc)
    try:
        ready = {side: _recv(pipes[side], side) for side in SIDES}
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        for k in range(spec.warmup + spec.steps):
            for side in SIDES if k % 2 == 0 else SIDES[::-1]:
                pipes[side].send("step")
                elapsed = _recv(pipes[side], side)
                print(f"step {k} {side}: {elapsed:.3f}s", file=sys.stderr, flush=True)
                if k >= spec.warmup:
                    times[side].append(elapsed)
        stats = {}
        for side in SIDES:
            pipes[side].send("stats")
            stats[side] = _recv(pipes[side], side)
            pipes[side].send("stop")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return _report(spec, ready, times, stats)


def _report(
    spec: TrainerBenchSpec,
    ready: dict[str, dict[str, Any]],
    times: dict[str, list[float]],
    stats: dict[str, dict[str, float]],
) -> dict[str, Any]:
    info = ready["engine"]
    tokens = info["tokens"]
    median = {side: statistics.median(times[side]) for side in SIDES}
    tps = {side: tokens / median[side] for side in SIDES}
    report: dict[str, Any] = {
        "tokens_per_s": tps["engine"],
        "baseline_tokens_per_s": tps["baseline"],
        "ratio": tps["engine"] / tps["baseline"],
        "peak_rss_mb": stats["engine"]["peak_rss_mb"],
        "baseline_peak_rss_mb": stats["baseline"]["peak_rss_mb"],
        "rss_ratio": stats["engine"]["peak_rss_mb"] / stats["baseline"]["peak_rss_mb"],
        # robust to machine load that drifts: adjacent steps share it
        "paired_ratio_median": statistics.median(
            b / e for e, b in zip(times["engine"], times["baseline"], strict=True)
        ),
        "ratio_of_fastest": min(times["baseline"]) / min(times["engine"]),
        "step_s_median": median["engine"],
        "baseline_step_s_median": median["baseline"],
        "step_s": times["engine"],
        "baseline_step_s": times["baseline"],
        "device": info["device"],
        "batch": {
            "sequences": spec.batch_size,
            "tokens": tokens,
            "padded_tokens": info["padded_tokens"],
            "micro_batches": info["micro_batches"],
        },
        "spec": asdict(spec),
        "baseline": (
            "HF causal-LM loss + backward per micro-batch, clip_grad_norm_, AdamW"
            if spec.baseline == "plain"
            else "the engine with default settings (full fine-tuning)"
        ),
        "engine_settings": spec.engine_settings,
        "trainable_params": info["trainable_params"],
        "baseline_trainable_params": ready["baseline"].get("trainable_params"),
    }
    if "peak_gpu_mb" in stats["engine"]:
        report["peak_gpu_mb"] = stats["engine"]["peak_gpu_mb"]
        report["baseline_peak_gpu_mb"] = stats["baseline"]["peak_gpu_mb"]
        report["gpu_memory_ratio"] = report["peak_gpu_mb"] / report["baseline_peak_gpu_mb"]
    return report


def _recv(pipe: Connection, side: str) -> Any:
    message = pipe.recv()
    if isinstance(message, dict) and "error" in message:
        raise RuntimeError(f"{side} worker failed:\n{message['error']}")
    return message


def _worker(side: str, spec: TrainerBenchSpec, pipe: Connection) -> None:
    import traceback

    try:
        step, info = _build(side, spec)
        pipe.send(info)
        import torch

        while (command := pipe.recv()) != "stop":
            if command == "step":
                start = time.perf_counter()
                step()
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                pipe.send(time.perf_counter() - start)
            elif command == "stats":
                stats = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
                if torch.cuda.is_available():
                    stats["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
                pipe.send(stats)
    except BaseException:
        pipe.send({"error": traceback.format_exc()})


def _build(side: str, spec: TrainerBenchSpec) -> tuple[Any, dict[str, Any]]:
    import torch
    from transformers import AutoConfig

    torch.set_num_threads(spec.threads or os.cpu_count() or 1)
    vocab = AutoConfig.from_pretrained(spec.model_dir).vocab_size
    batch = synthetic_batch(spec, vocab)
    plan = plan_micro_batches([len(s.input_ids) for s in batch.samples], spec.micro_batch_tokens)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = {
        "tokens": sum(len(s.input_ids) for s in batch.samples),
        "padded_tokens": sum(m.padded_tokens for m in plan),
        "micro_batches": len(plan),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
    }
    if side == "engine" or spec.baseline == "engine":
        from conveyor.config import TrainerConfig
        from conveyor.trainer.engine import TorchTrainingEngine

        values: dict[str, Any] = {
            "lr": 1e-6,
            "micro_batch_tokens": spec.micro_batch_tokens,
            "device": device,
            "seed": spec.seed,
        }
        if side == "engine":
            values.update(spec.engine_settings)
        engine = TorchTrainingEngine(spec.model_dir, TrainerConfig(**values))
        info["trainable_params"] = sum(
            p.numel() for p in engine.model.parameters() if p.requires_grad
        )
        return (lambda: engine.step(batch)), info
    return _plain_loop(spec, batch, device), info


def parse_settings(items: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` trainer settings (dotted keys nest) as a nested dict of the values set, read
    and checked as `conveyor train --set trainer.KEY=VALUE` reads them (`load_config`)."""
    from conveyor.config import load_config

    for item in items:
        if not item.partition("=")[1]:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
    resolved = load_config(None, [f"trainer.{item}" for item in items])
    out: dict[str, Any] = {}
    for key, source in resolved.sources.items():
        if source != "--set":
            continue
        value: Any = resolved.config
        for name in key.split("."):
            value = getattr(value, name)
        *parents, leaf = key.split(".")[1:]
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _plain_loop(spec: TrainerBenchSpec, batch: TrainBatch, device: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    model: Any = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=torch.float32)
    model.to(torch.device(device))
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    samples = batch.samples
    plan = plan_micro_batches([len(s.input_ids) for s in samples], spec.micro_batch_tokens)
    total = max(batch.trained_tokens, 1)

    def step() -> None:
        for micro in plan:
            rows = len(micro.indices)
            ids = torch.zeros(rows, micro.padded_length, dtype=torch.long)
            attention = torch.zeros_like(ids)
            labels = torch.full_like(ids, -100)
            trained = 0
            for row, i in enumerate(micro.indices):
                sample = samples[i]
                n = len(sample.input_ids)
                ids[row, :n] = torch.tensor(sample.input_ids)
                attention[row, :n] = 1
                mask = torch.tensor(sample.loss_mask).bool()
                labels[row, :n] = torch.where(mask, ids[row, :n], -100)
                trained += int(mask[1:].sum())
            out = model(
                input_ids=ids.to(device),
                attention_mask=attention.to(device),
                labels=labels.to(device),
                use_cache=False,
            )
            (out.loss * (trained / total)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def tiny_model_dir() -> Path:
    """A 2-layer random Llama with SmolLM2's vocabulary size, for `--quick` runs."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(tempfile.mkdtemp(prefix="conveyor-bench-tiny-"))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder
