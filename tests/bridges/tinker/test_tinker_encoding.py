"""The Tinker bridge's encoding: real `tinker` Datum / ForwardBackwardRequest objects serialized
by the SDK's own wire encoder, decoded back and checked against our samples and our loss.

The fast tests build samples from the real tokenizer (ids of a rendered chat, the assistant part
trained, behaviour logprobs drawn from a seeded generator); the slow ones use trajectories of real
rollouts of the embedded model (the `conveyor eval` run made once per test run).
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from conveyor.bridges.tinker import datums
from conveyor.bridges.tinker import wire_check as tinker_check
from conveyor.cli import app
from conveyor.config.training import LossConfig
from conveyor.trainer.backend import TrainBatch
from conveyor.types import TrainingSample

pytest.importorskip("tinker")


def tokenizer_batch(tokenizer: Any, n: int = 4) -> TrainBatch:
    """Samples of real token ids: a prompt (mask 0) and a reply (mask 1), of different lengths."""
    rng = random.Random(7)
    items = []
    for i in range(n):
        prompt = tokenizer.encode(f"User: list the files under folder number {i}.\nAssistant:")
        reply = tokenizer.encode(" ls -la" + " && pwd" * (i + 1))
        ids = prompt + reply
        mask = [0] * len(prompt) + [1] * len(reply)
        logprobs = [0.0] + [-rng.uniform(0.01, 3.0) for _ in ids[1:]]
        sample = TrainingSample(
            input_ids=ids, loss_mask=mask, logprobs=logprobs, prompt_length=len(prompt)
        )
        items.append((sample, [1.0, -0.5, 0.25, -1.5][i % 4]))
    return TrainBatch(items)


@pytest.mark.parametrize(
    "reduction", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
)
@pytest.mark.parametrize(
    ("loss", "expected_fn"),
    [
        ({"dual_clip_c": None}, "ppo"),
        ({"dual_clip_c": None, "clip_low": 1.0, "clip_high": math.inf}, "importance_sampling"),
        ({}, "custom"),  # the default dual clip has no Tinker built-in
    ],
)
def test_encoded_datums_reproduce_policy_loss(
    tokenizer: Any, reduction: str, loss: dict[str, Any], expected_fn: str
) -> None:
    settings = LossConfig(reduction=reduction, **loss)
    assert datums.plan_loss(settings).loss_fn == expected_fn
    report = tinker_check.check_batch(tokenizer_batch(tokenizer), "test", settings)
    failed = [c for c in report.checks if not c.ok]
    assert report.ok and not failed, failed
    names = {c.name for c in report.checks}
    assert {"shift", "dtypes", "shapes", "behaviour_logprobs"} <= names
    assert f"loss[{expected_fn},{reduction},perturbed]" in names


def test_wire_round_trip_keeps_the_shift_and_dtypes(tokenizer: Any) -> None:
    batch = tokenizer_batch(tokenizer, 2)
    plan = datums.plan_loss(LossConfig(dual_clip_c=None))
    body = tinker_check.encode_request(datums.batch_datums(batch, LossConfig(), plan), plan)
    loss_fn, config, wire = tinker_check.decode_request(body)
    assert loss_fn == "ppo" and config == pytest.approx(
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    )
    for (sample, _), datum in zip(batch.items, wire, strict=True):
        assert datum.input_ids == sample.input_ids[:-1]
        assert datum.fields["target_tokens"].tolist() == sample.input_ids[1:]
        assert datum.fields["target_tokens"].dtype == np.int64
        assert datum.fields["advantages"].dtype == np.float32
        off_mask = ~np.asarray(sample.loss_mask[1:], dtype=bool)
        assert off_mask.any() and np.all(datum.fields["advantages"][off_mask] == 0.0)


def test_token_scales_make_the_sum_each_reduction() -> None:
    def sample(n: int, trained: int) -> TrainingSample:
        mask = [0] * (n - trained) + [1] * trained
        return TrainingSample(
            input_ids=list(range(n)), loss_mask=mask, logprobs=[0.0] * n, prompt_length=0
        )

    samples = [sample(10, 4), sample(6, 2), sample(5, 0)]
    token = datums.token_scales(samples, LossConfig(reduction="token_mean"))
    assert token == [pytest.approx(1 / 6)] * 3
    seq = datums.token_scales(samples, LossConfig(reduction="seq_mean_token_mean"))
    assert seq == [pytest.approx(1 / 8), pytest.approx(1 / 4), 0.0]  # 2 samples have tokens
    norm = datums.token_scales(samples, LossConfig(reduction="seq_mean_token_sum_norm"))
    assert norm == [pytest.approx(1 / 30)] * 3  # 3 samples x longest sample (10)
    fixed = datums.token_scales(
        samples, LossConfig(reduction="seq_mean_token_sum_norm", norm_len=4)
    )
    assert fixed == [pytest.approx(1 / 12)] * 3


def test_tis_and_kl_map_to_refusal_and_custom_loss() -> None:
    with pytest.raises(datums.TinkerLossUnsupported, match=r"trainer\.loss\.tis"):
        datums.plan_loss(LossConfig(tis=True))
    plan = datums.plan_loss(LossConfig(dual_clip_c=None, kl_coef=0.1))
    assert plan.loss_fn == "custom" and "kl_coef" in plan.reason


def test_check_without_the_sdk_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "tinker", None)  # import tinker -> ImportError
    file = tmp_path / "t.jsonl"
    file.write_text("")
    result = CliRunner().invoke(
        app, ["bridge", "check", "--backend", "tinker", "--trajectories", str(file), "--json"]
    )
    assert result.exit_code == 3, result.output
    assert "tinker==0.38.0" in result.output


# --- real rollouts -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rollouts(quickstart_eval: tuple[Path, str]) -> Path:
    """trajectories.jsonl of real sampled rollouts: 2 families x 2 tasks x 2 samples of the
    embedded model, from the `conveyor eval` run made once per test run (tests/conftest.py)."""
    run, _ = quickstart_eval
    return run / "trajectories.jsonl"


@pytest.mark.slow
def test_bridge_check_cli_holds_on_real_rollouts(rollouts: Path) -> None:
    result = subprocess.run(
        [
            sys.executable, "-m", "conveyor.cli", "bridge", "check",
            "--backend", "tinker", "--trajectories", str(rollouts), "--json",
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report) == {"backend", "version", "python", "samples", "checks", "ok"}
    assert report["ok"] is True and report["backend"] == "tinker" and report["version"] == "0.38.0"
    assert report["samples"] >= 4
    names = {c["name"] for c in report["checks"]}
    for reduction in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        for fn in ("ppo", "importance_sampling", "custom"):
            assert f"loss[{fn},{reduction},perturbed]" in names


@pytest.mark.slow
def test_an_off_by_one_datum_fails_the_check(
    rollouts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = datums.to_datum

    def shifted_wrong(sample: TrainingSample, advantage: float, scale: float, **kw: Any) -> Any:
        # targets aligned with the inputs instead of one ahead: the classic off-by-one
        datum = real(sample, advantage, scale, **kw)
        from tinker import types

        fields = dict(datum.loss_fn_inputs)
        fields["target_tokens"] = types.TensorData.from_numpy(
            np.asarray(sample.input_ids[:-1], dtype=np.int64)
        )
        return types.Datum(model_input=datum.model_input, loss_fn_inputs=fields)

    monkeypatch.setattr(datums, "to_datum", shifted_wrong)
    result = CliRunner().invoke(
        app, ["bridge", "check", "--backend", "tinker", "--trajectories", str(rollouts), "--json"]
    )
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    failed = {c["name"] for c in report["checks"] if not c["ok"]}
    assert "shift" in failed
