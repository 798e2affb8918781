"""The trainer's memory model (`trainer.memory`) against the H200 GPU check's measured peaks."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from conveyor.models import model_architecture
from conveyor.trainer import memory
from conveyor.trainer.memory import GIB, Architecture, trainer_memory

REPO = Path(__file__).resolve().parents[2]
# the GPU check's own reports (bf16 weights and state); the autocast run is checked below
MEASURED = sorted(
    p for p in (REPO / "docs" / "data").glob("gpu-check-h200-*.json") if "autocast" not in p.name
)


def _cases() -> list[tuple[str, dict, str]]:
    out = []
    for path in MEASURED:
        report = json.loads(path.read_text())
        for case in report["cases"]:
            out.append((path.name, case, report.get("attn") or "sdpa"))
    return out


CASES = _cases()


def test_the_h200_fixture_is_there() -> None:
    assert len(MEASURED) >= 7 and len(CASES) >= 20
    assert all(case["peak_gib"] for _, case, _ in CASES)


@pytest.mark.parametrize(
    ("name", "case", "attn"),
    CASES,
    ids=[f"{n[:-5]}-{c['tokens']}-{c['layout']}-{c['logits']}" for n, c, _ in CASES],
)
def test_trainer_memory_is_within_20_percent_of_each_measured_h200_peak(
    name: str, case: dict, attn: str
) -> None:
    """The GPU check's setup: bf16 weights, gradients and AdamW moments, per-layer
    checkpointing, logits in 4,096-token chunks or whole, sdpa (dense mask) or flex."""
    report = json.loads((REPO / "docs" / "data" / name).read_text())
    raw, _ = model_architecture("/models/Qwen3-1.7B")  # the shipped architecture
    arch = Architecture.from_config(raw)
    assert arch.parameters() == report["parameters"]  # the model the check built
    rows = 1 if case["layout"] == "packed" else case["sequences"]
    parts = trainer_memory(
        arch,
        tokens=case["processed_tokens"],
        rows=rows,
        param_bytes=2,
        autocast=False,
        checkpointing=True,
        logits_chunk_tokens=report["chunk_tokens"] if case["logits"] == "chunked" else None,
        logit_positions=case["real_tokens"] - case["sequences"],
        dense_mask=attn == "sdpa",
    )
    predicted = parts["total"] / GIB
    assert abs(predicted / case["peak_gib"] - 1) <= 0.20, (predicted, case["peak_gib"])


def test_the_gpu_check_predicts_with_the_same_model() -> None:
    pytest.importorskip("torch")
    from conveyor.trainer import gpu_check

    _, case, _ = CASES[0]
    predicted = gpu_check.predicted_bytes(
        "qwen3-1.7b",
        0,
        case["real_tokens"],
        "packed",
        "chunked",
        1,
        case["tokens"],
        4096,
        case["sequences"],
    )
    assert abs(predicted / GIB / case["peak_gib"] - 1) <= 0.20


def test_the_memory_module_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(memory.__file__).read_text())
    imported = {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    } | {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported


def test_shipped_architectures_give_the_published_parameter_counts() -> None:
    counts = {
        name: Architecture.from_config(model_architecture(f"/nowhere/{name}")[0]).parameters()
        for name in ("Qwen3-1.7B", "Qwen3-8B", "Qwen3-32B")
    }
    assert counts["Qwen3-1.7B"] == 1_720_574_976  # torch's count of the GPU check's model
    assert 8.1e9 < counts["Qwen3-8B"] < 8.3e9  # "8.2B"
    assert 32.5e9 < counts["Qwen3-32B"] < 33.0e9  # "32.8B"


def test_the_builtin_trainer_keeps_16_bytes_a_parameter_and_bf16_casts() -> None:
    """float32 weights, gradients and both AdamW moments, plus autocast's bf16 copies; FSDP
    divides the state by the shards; LoRA keeps gradients and moments for adapters only."""
    arch = Architecture.from_config(model_architecture("/x/Qwen3-8B")[0])
    p = arch.parameters()
    one = trainer_memory(arch, tokens=4096)
    assert (one["parameters"], one["gradients"], one["optimizer"]) == (4 * p, 4 * p, 8 * p)
    assert one["autocast_copies"] == 2 * p
    eight = trainer_memory(arch, tokens=4096, shards=8)
    assert eight["optimizer"] == 8 * p // 8 and eight["activations"] == one["activations"]
    lora = trainer_memory(arch, tokens=4096, trainable=arch.lora_parameters(16, ["q_proj"]))
    assert lora["parameters"] == 4 * p and lora["optimizer"] < p // 100
    chunked = trainer_memory(arch, tokens=32768, logits_chunk_tokens=4096)
    whole = trainer_memory(arch, tokens=32768)
    assert chunked["logits"] < whole["logits"] / 10
    unchecked = trainer_memory(arch, tokens=4096, checkpointing=False)
    assert unchecked["activations"] > 5 * one["activations"]


AUTOCAST = json.loads(
    (REPO / "docs" / "data" / "gpu-check-h200-autocast-2026-11-27.json").read_text()
)


@pytest.mark.parametrize(
    "case",
    AUTOCAST["cases"],
    ids=[f"{c['tokens']}-{c['layout']}-{c['logits']}" for c in AUTOCAST["cases"]],
)
def test_the_builtin_trainers_precision_is_within_20_percent_of_each_h200_peak(case: dict) -> None:
    """float32 weights and AdamW state, forward under bf16 autocast (the built-in trainer's
    precision), same model and checkpointing, 8k and 16k tokens: measured on an H200, none of
    these peaks was used to fit the constants."""
    arch = Architecture.from_config(model_architecture("/models/Qwen3-1.7B")[0])
    rows = 1 if case["layout"] == "packed" else case["sequences"]
    parts = trainer_memory(
        arch,
        tokens=case["processed"],
        rows=rows,
        param_bytes=4,
        autocast=True,
        logits_chunk_tokens=4096 if case["logits"] == "chunked" else None,
        logit_positions=case["real"] - case["sequences"],
    )
    predicted = parts["total"] / GIB
    assert abs(predicted / case["peak_gib"] - 1) <= 0.20, (predicted, case["peak_gib"])


CPU_RSS = json.loads((REPO / "docs" / "data" / "cpu-bench-trainer-rss-2026-11-27.json").read_text())
# `conveyor bench trainer --model tiny`'s model (bench.trainer.tiny_model_dir)
TINY_LLAMA = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
# SmolLM2-135M-Instruct's config.json (the embedded model), the fields the plan reads
EMBEDDED = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "model_type": "llama",
}


@pytest.mark.parametrize(
    "run",
    CPU_RSS["runs"],
    ids=[f"{r['model']}-ckpt-{r['gradient_checkpointing']}" for r in CPU_RSS["runs"]],
)
def test_cpu_peak_rss_of_bench_trainer_runs_is_within_20_percent(run: dict) -> None:
    """`conveyor bench trainer` (the built-in trainer: float32 weights and AdamW, bf16 autocast
    on that bf16-capable CPU) measured on CPU: the plan plus the process's own RSS before any
    model (imports) against the engine side's peak RSS over two steps."""
    from conveyor.bench.trainer import TrainerBenchSpec, synthetic_batch
    from conveyor.trainer.batching import plan_micro_batches

    arch = Architecture.from_config(TINY_LLAMA if run["model"] == "tiny" else EMBEDDED)
    assert run["report"]["trainable_params"] == arch.parameters()  # the model measured
    spec = TrainerBenchSpec(
        model_dir="unused",
        batch_size=run["batch_size"],
        seq_len=run["seq_len"],
        micro_batch_tokens=run["micro_batch_tokens"],
    )
    samples = [sample for sample, _ in synthetic_batch(spec, arch.vocab).items]
    peaks = []
    for micro in plan_micro_batches([len(s.input_ids) for s in samples], spec.micro_batch_tokens):
        rows = [samples[i] for i in micro.indices]
        # the built-in trainer computes logits where any row of the micro-batch trains a token
        kept = {t for s in rows for t in range(1, len(s.input_ids)) if s.loss_mask[t]}
        parts = trainer_memory(
            arch,
            tokens=micro.padded_tokens,
            rows=len(rows),
            param_bytes=4,
            autocast=True,
            checkpointing=run["gradient_checkpointing"],
            logit_positions=len(rows) * len(kept),
        )
        peaks.append(parts["total"])
    predicted_mb = CPU_RSS["process_baseline_mb"] + max(peaks) / 2**20
    measured_mb = run["report"]["peak_rss_mb"]
    assert abs(predicted_mb / measured_mb - 1) <= 0.20, (predicted_mb, measured_mb)
