"""`conveyor bench trainer --quick --json`: both loops run and the JSON contract holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from conveyor.bench.trainer import TrainerBenchSpec, synthetic_batch
from conveyor.bench.trainer_cli import register
from conveyor.trainer.batching import plan_micro_batches


def test_synthetic_batch_is_seeded_and_padded() -> None:
    spec = TrainerBenchSpec(model_dir="unused", batch_size=6, seq_len=64, micro_batch_tokens=128)
    a, b = synthetic_batch(spec, 100), synthetic_batch(spec, 100)
    assert a == b
    lengths = [len(s.input_ids) for s in a.samples]
    assert min(lengths) >= 48 and max(lengths) <= 64 and len(set(lengths)) > 1
    assert all(s.loss_mask[: s.prompt_length] == [0] * s.prompt_length for s in a.samples)
    plan = plan_micro_batches(lengths, spec.micro_batch_tokens)
    assert sum(m.padded_tokens for m in plan) > sum(lengths)  # the loops do see padding


def _bench_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def bench() -> None:
        """The bench sub-app stand-in."""

    register(app)
    return app


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("nosuchkey=1", "nosuchkey"),
        ("train_last_layers=0", "train_last_layers"),
        ("lora.enabled", "expected KEY=VALUE"),
    ],
)
def test_bad_engine_settings_are_refused_before_anything_starts(option: str, message: str) -> None:
    result = CliRunner().invoke(_bench_app(), ["trainer", "--quick", "--set", option])
    assert result.exit_code == 2 and message in result.output


@pytest.mark.slow
def test_engine_settings_are_measured_against_the_full_fine_tuning_engine() -> None:
    args = ["trainer", "--quick", "--json", "--warmup", "0", "--steps", "2", "--baseline", "engine"]
    args += ["--set", "lora.enabled=true", "--set", "train_last_layers=1", "--packing-tasks", "0"]
    result = CliRunner().invoke(_bench_app(), args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["engine_settings"] == {"lora": {"enabled": True}, "train_last_layers": 1}
    assert report["baseline"].startswith("the engine with default settings")
    assert 0 < report["trainable_params"] < report["baseline_trainable_params"] / 10


@pytest.mark.slow
def test_quick_bench_prints_the_json_contract_last() -> None:
    args = ["trainer", "--quick", "--json", "--warmup", "1", "--packing-tasks", "0"]
    result = CliRunner().invoke(_bench_app(), args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert "packing" not in report
    for key in ("tokens_per_s", "baseline_tokens_per_s", "ratio", "peak_rss_mb"):
        assert report[key] > 0, key
    assert report["ratio"] == pytest.approx(
        report["tokens_per_s"] / report["baseline_tokens_per_s"]
    )
    assert len(report["step_s"]) == len(report["baseline_step_s"]) == 10
    assert report["batch"]["padded_tokens"] >= report["batch"]["tokens"]


@pytest.mark.slow
def test_packing_is_measured_against_padding_on_real_trajectories(model_dir: Path) -> None:
    """The quickstart's oracle traces (real, multi-turn), the tiny model, one step each side."""
    args = ["trainer", "--quick", "--json", "--warmup", "0", "--steps", "1"]
    args += ["--packing-tasks", "3", "--packing-micro-batch-tokens", "4096"]
    result = CliRunner().invoke(_bench_app(), args)
    assert result.exit_code == 0, result.output
    packing = json.loads(result.output.strip().splitlines()[-1])["packing"]
    assert packing["padded_tok_s"] > 0 and packing["packed_tok_s"] > 0
    assert packing["ratio"] == pytest.approx(packing["packed_tok_s"] / packing["padded_tok_s"])
    assert packing["sequences"] >= 3 and packing["micro_batch_tokens"] == 4096
    # real trajectories differ in length: right-padding them wastes positions, packing none
    assert 0 < packing["padding_fraction"] < 1
    assert packing["padding_fraction"] == pytest.approx(
        1 - packing["tokens"] / packing["padded_tokens"]
    )
    assert packing["micro_batches"]["packed"] <= packing["micro_batches"]["padded"]
    assert "configs/filenav.yaml" in packing["trajectories"]


def test_a_missing_packing_config_is_refused_before_anything_starts() -> None:
    args = ["trainer", "--quick", "--packing-config", "none.yaml"]
    result = CliRunner().invoke(_bench_app(), args)
    assert result.exit_code == 2 and "none.yaml not found" in result.output
