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

Then, in the same run, `packing`: the engine (with the same settings) right-padded against
packed (`trainer.packing`), both on real trajectories: the quickstart's oracle traces of
`packing_tasks` instances (`configs/filenav.yaml`'s families through the real agent loop,
tools and chat template: what its warm start trains on), with that config's micro-batch budget
(padded tokens for one side, real tokens for the other). Two more processes, interleaved the
same way; `padding_fraction` is the padded side's share of padding positions.
"""

from __future__ import annotations

import asyncio
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
from conveyor.trainer.batching import plan_micro_batches, plan_packed_micro_batches
from conveyor.types import TrainingSample

SIDES = ("engine", "baseline")
PACKING_SIDES = ("padded", "packed")


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
    # padded vs packed on real trajectories: oracle traces of this many instances per family
    # of `packing_config` (0: not measured), micro-batch budget `packing_micro_batch_tokens`
    # (None: the config's trainer.micro_batch_tokens); the trajectories are tokenized by the
    # embedded model unless `packing_model_path` names another HF folder
    packing_tasks: int = 0
    packing_config: str = "configs/filenav.yaml"
    packing_micro_batch_tokens: int | None = None
    packing_model_path: str | None = None


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


def quickstart_batch(spec: TrainerBenchSpec) -> tuple[TrainBatch, int, str]:
    """Real training samples for the packing comparison, the micro-batch budget, and a line
    saying where they came from.

    The oracle traces of `spec.packing_tasks` train instances per family of
    `spec.packing_config` (the quickstart's warm-start data: multi-turn, real tool output, the
    model's chat template, token-exact), advantages +-1 (seeded); their behaviour logprobs are
    the oracle's 0.0, which changes no step's cost.
    """
    from conveyor.app.compose import Composition
    from conveyor.app.train import warm_start_samples
    from conveyor.config import load_config

    path = Path(spec.packing_config)
    if not path.is_file():
        raise ValueError(f"packing config {path} not found (run from the repository root)")
    overrides = [f"rl.warm_start.tasks={spec.packing_tasks}", f"trainer.seed={spec.seed}"]
    if spec.packing_model_path is not None:
        overrides.append(f"model.path={spec.packing_model_path}")
    config = load_config(path, overrides).config
    parts = Composition(config)

    async def traces() -> tuple[list[TrainingSample], str]:
        try:
            return await warm_start_samples(parts)
        finally:
            await parts.close()

    samples, said = asyncio.run(traces())
    if not samples:
        raise ValueError(f"{path}: no oracle trace to measure packing on ({said})")
    rng = random.Random(spec.seed)
    batch = TrainBatch(items=[(s, rng.choice([-1.0, 1.0])) for s in samples])
    budget = spec.packing_micro_batch_tokens or config.trainer.micro_batch_tokens
    return batch, budget, f"{path}: {said}"


def run_trainer_bench(spec: TrainerBenchSpec) -> dict[str, Any]:
    """Measure both sides, interleaved step by step, then padded against packed on real
    trajectories (when `spec.packing_tasks`); returns the JSON report."""
    ready, times, stats = _interleave(spec, SIDES, None)
    report = _report(spec, ready, times, stats)
    if spec.packing_tasks:
        batch, budget, source = quickstart_batch(spec)
        real = (batch, budget)
        ready, times, stats = _interleave(spec, PACKING_SIDES, real)
        report["packing"] = _packing_report(ready, times, stats, budget, source)
    return report


def _interleave(
    spec: TrainerBenchSpec, sides: tuple[str, str], real: tuple[TrainBatch, int] | None
) -> tuple[dict[str, Any], dict[str, list[float]], dict[str, dict[str, float]]]:
    """Start one process per side, alternate single steps between them (order swapped every
    step); returns what each reported at start, its measured step times, and its stats."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    pipes: dict[str, Connection] = {}
    procs = []
    for side in sides:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(side, spec, child, real), daemon=True)
        proc.start()
        pipes[side] = parent
        procs.append(proc)
    try:
        ready = {side: _recv(pipes[side], side) for side in sides}
        times: dict[str, list[float]] = {side: [] for side in sides}
        for k in range(spec.warmup + spec.steps):
            for side in sides if k % 2 == 0 else sides[::-1]:
                pipes[side].send("step")
                elapsed = _recv(pipes[side], side)
                print(f"step {k} {side}: {elapsed:.3f}s", file=sys.stderr, flush=True)
                if k >= spec.warmup:
                    times[side].append(elapsed)
        stats = {}
        for side in sides:
            pipes[side].send("stats")
            stats[side] = _recv(pipes[side], side)
            pipes[side].send("stop")
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return ready, times, stats


def _packing_report(
    ready: dict[str, Any],
    times: dict[str, list[float]],
    stats: dict[str, dict[str, float]],
    budget: int,
    source: str,
) -> dict[str, Any]:
    tokens = ready["padded"]["tokens"]
    median = {side: statistics.median(times[side]) for side in PACKING_SIDES}
    padded_tps, packed_tps = tokens / median["padded"], tokens / median["packed"]
    return {
        "padded_tok_s": padded_tps,
        "packed_tok_s": packed_tps,
        "padding_fraction": 1.0 - tokens / ready["padded"]["padded_tokens"],
        "ratio": packed_tps / padded_tps,
        "paired_ratio_median": statistics.median(
            d / p for d, p in zip(times["padded"], times["packed"], strict=True)
        ),
        "padded_step_s": times["padded"],
        "packed_step_s": times["packed"],
        "sequences": ready["padded"]["sequences"],
        "tokens": tokens,
        "padded_tokens": ready["padded"]["padded_tokens"],
        "micro_batch_tokens": budget,
        "micro_batches": {side: ready[side]["micro_batches"] for side in PACKING_SIDES},
        "peak_rss_mb": {side: stats[side]["peak_rss_mb"] for side in PACKING_SIDES},
        "trajectories": f"oracle traces of {source}",
    }


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


def _worker(
    side: str, spec: TrainerBenchSpec, pipe: Connection, real: tuple[TrainBatch, int] | None
) -> None:
    import traceback

    try:
        step, info = _build(side, spec, real)
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


def _build(
    side: str, spec: TrainerBenchSpec, real: tuple[TrainBatch, int] | None = None
) -> tuple[Any, dict[str, Any]]:
    import torch
    from transformers import AutoConfig

    torch.set_num_threads(spec.threads or os.cpu_count() or 1)
    if real is None:
        vocab = AutoConfig.from_pretrained(spec.model_dir).vocab_size
        batch, budget = synthetic_batch(spec, vocab), spec.micro_batch_tokens
    else:
        batch, budget = real
    lengths = [len(s.input_ids) for s in batch.samples]
    plan = (plan_packed_micro_batches if side == "packed" else plan_micro_batches)(lengths, budget)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = {
        "sequences": len(lengths),
        "tokens": sum(lengths),
        "padded_tokens": sum(m.padded_tokens for m in plan),
        "micro_batches": len(plan),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
    }
    if side != "baseline" or spec.baseline == "engine":
        from conveyor.config import TrainerConfig
        from conveyor.trainer.engine import TorchTrainingEngine

        values: dict[str, Any] = {
            "lr": 1e-6,
            "micro_batch_tokens": budget,
            "device": device,
            "seed": spec.seed,
        }
        if side != "baseline":
            values.update(spec.engine_settings)
        if side in PACKING_SIDES:
            values.update(packing=side == "packed", micro_batch_tokens=budget)
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
