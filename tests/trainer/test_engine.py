"""TorchTrainingEngine on a tiny random Llama: micro-batching, masks, LoRA, probe, schedule."""

from __future__ import annotations

import copy
import math
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_llama import random_batch, save_tiny_llama

from conveyor.config import ConfigError, LossConfig, TrainerConfig
from conveyor.trainer import losses
from conveyor.trainer.backend import TrainBatch, TrainingBackend, logprob_agreement
from conveyor.trainer.engine import (
    TorchTrainingEngine,
    kept_token_logprobs,
    lr_factor,
    native_bf16,
    token_logprobs,
)
from conveyor.types import TrainingSample


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def engine(folder: Path, **overrides: Any) -> TorchTrainingEngine:
    # float32 unless a test asks otherwise: these tests compare updates and logprobs at float32
    # tolerances, and dtype auto is bf16 autocast on a CPU with AVX512-BF16
    values: dict[str, Any] = {
        "lr": 1e-3,
        "seed": 0,
        "device": "cpu",
        "micro_batch_tokens": 8192,
        "dtype": "float32",
    }
    values.update(overrides)
    options = {key: values.pop(key) for key in ("temperature", "total_steps") if key in values}
    return TorchTrainingEngine(folder, TrainerConfig(**values), **options)


def params(e: TorchTrainingEngine) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in e.model.named_parameters()}


def assert_params_close(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float
) -> None:
    assert a.keys() == b.keys()
    worst = max((a[n] - b[n]).abs().max().item() for n in a)
    assert worst <= atol, f"max parameter difference {worst}"


def capture_hidden_grads(e: TorchTrainingEngine) -> list[torch.Tensor]:
    """A list that receives d loss / d (final hidden states) of every backward pass of `e`.

    The final hidden state at position t feeds only the logits that predict token t + 1, at
    every position (the LM head itself runs only where some row trains a token).
    """
    grads: list[torch.Tensor] = []

    def keep(grad: torch.Tensor) -> None:
        grads.append(grad.detach().clone())

    def on_forward(_module: torch.nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        if out.requires_grad:
            out.register_hook(keep)

    e.model.get_decoder().norm.register_forward_hook(on_forward)
    return grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_token_logprobs_equal_sequence_logprobs(temperature: float, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    logits = (3 * torch.randn(3, 9, 50)).to(dtype).requires_grad_()
    ids = torch.randint(0, 50, (3, 9))
    expected = losses.sequence_logprobs(logits, ids, temperature=temperature)
    got = token_logprobs(logits, ids, temperature=temperature)
    assert got.dtype == expected.dtype
    assert got[:, 0].abs().max() == 0
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    weights = torch.randn(3, 9, dtype=got.dtype)
    (grad_expected,) = torch.autograd.grad((expected * weights).sum(), logits)
    (grad_got,) = torch.autograd.grad((got * weights).sum(), logits)
    # bf16 keeps 8 mantissa bits: the two computations may round one gradient element a unit in
    # the last place apart (seen on a fresh CI venv: 3e-5 absolute, 0.7% relative, 1 of 1350)
    tolerance = 1e-2 if dtype is torch.bfloat16 else 1e-5
    torch.testing.assert_close(grad_got, grad_expected, atol=1e-5, rtol=tolerance)


def test_kept_token_logprobs_equal_full_ones_at_kept_positions_only() -> None:
    torch.manual_seed(0)
    logits = (3 * torch.randn(2, 9, 50)).requires_grad_()
    ids = torch.randint(0, 50, (2, 9))
    targets = torch.tensor([2, 3, 7])
    full = token_logprobs(logits, ids, temperature=0.7)
    kept = kept_token_logprobs(logits[:, targets - 1], ids, targets, temperature=0.7)
    torch.testing.assert_close(kept[:, targets], full[:, targets])
    others = [c for c in range(9) if c not in targets.tolist()]
    assert kept[:, others].abs().max() == 0
    (grad,) = torch.autograd.grad(kept.sum(), logits)
    assert grad[:, [c - 1 for c in others if c > 0]].abs().max() == 0  # no gradient elsewhere
    assert grad[:, targets - 1].abs().max() > 0
    with pytest.raises(ValueError, match="kept positions"):
        kept_token_logprobs(logits, ids, targets)


def test_engine_is_a_training_backend(tiny: Path) -> None:
    assert isinstance(engine(tiny), TrainingBackend)


@pytest.mark.parametrize(
    "loss",
    [
        {"reduction": "token_mean"},
        {"reduction": "seq_mean_token_mean"},
        {"reduction": "seq_mean_token_sum_norm"},
        {"reduction": "token_mean", "tis": True, "tis_cap": 1.5, "kl_coef": 0.1},
    ],
    ids=["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "tis_kl"],
)
def test_micro_batching_does_not_change_the_update(tiny: Path, loss: dict[str, Any]) -> None:
    batch = random_batch(n=7, seed=1)
    # an all-masked sample: it counts in seq_mean_token_sum_norm's |S| only
    silent = TrainingSample(
        input_ids=[1, 2, 3, 4], loss_mask=[0] * 4, logprobs=[0.0] * 4, prompt_length=4
    )
    items = [*batch.items, (silent, 0.7)]
    refs = [[-2.0 + 0.01 * t for t in range(len(s.input_ids))] for s, _ in items]
    batch = TrainBatch(items=items, ref_logprobs=refs)
    whole = engine(tiny, micro_batch_tokens=100_000, loss={"options": loss})
    split = engine(tiny, micro_batch_tokens=30, loss={"options": loss})
    assert len(batch.items) > 4  # the small budget really splits it (each is <= 24 tokens)
    a, b = whole.step(batch), split.step(batch)
    assert a.loss == pytest.approx(b.loss, abs=1e-6)
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-5)
    assert a.logprob_diff_mean == pytest.approx(b.logprob_diff_mean, abs=1e-6)
    assert a.logprob_diff_max == pytest.approx(b.logprob_diff_max, abs=1e-6)
    assert a.metrics == pytest.approx(b.metrics, abs=1e-6)
    assert_params_close(params(whole), params(split), atol=1e-6)


@pytest.mark.parametrize(
    "reduction", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
)
def test_zero_advantage_samples_are_skipped_without_changing_the_update(
    tiny: Path, reduction: str
) -> None:
    """Samples with advantage 0 are not forwarded, yet the update is that of the whole batch."""
    batch = random_batch(n=6, seed=4)
    items = [(s, 0.0 if i % 2 else a) for i, (s, a) in enumerate(batch.items)]
    e = engine(tiny, max_grad_norm=None, loss={"options": {"reduction": reduction}})
    model = copy.deepcopy(e.model)
    result = e.step(TrainBatch(items=items))
    assert result.skipped_samples == 3
    assert result.tokens == sum(len(s.input_ids) for i, (s, _) in enumerate(items) if i % 2 == 0)
    # the logprob probe covers the forwarded samples' trained tokens only
    assert result.probed_tokens == sum(sum(s.loss_mask) for s, _ in items[::2]) > 0
    assert result.as_dict()["train/probed_tokens"] == result.probed_tokens

    n = max(len(s.input_ids) for s, _ in items)
    ids = torch.zeros(len(items), n, dtype=torch.long)
    mask = torch.zeros(len(items), n)
    for row, (sample, _) in enumerate(items):
        ids[row, : len(sample.input_ids)] = torch.tensor(sample.input_ids)
        mask[row, : len(sample.input_ids)] = torch.tensor(sample.loss_mask, dtype=torch.float)
    advantages = torch.tensor([a for _, a in items])
    logprobs = losses.sequence_logprobs(model(input_ids=ids).logits, ids)
    loss, _ = losses.policy_loss(
        logprobs,
        logprobs.detach(),
        advantages,
        mask,
        LossConfig(reduction=reduction, norm_len=n),  # type: ignore[arg-type]
    )
    loss.backward()
    norm = torch.sqrt(sum(p.grad.square().sum() for p in model.parameters()))  # type: ignore[misc,union-attr]
    assert result.loss == pytest.approx(float(loss.detach()), abs=1e-6)
    assert result.grad_norm == pytest.approx(float(norm), rel=1e-5)


def test_an_all_zero_advantage_batch_forwards_nothing_and_still_steps(tiny: Path) -> None:
    batch = random_batch(n=3, seed=5)
    e = engine(tiny)
    before = params(e)
    result = e.step(TrainBatch(items=[(s, 0.0) for s in batch.samples]))
    assert result.skipped_samples == 3 and result.tokens == 0
    assert result.probed_tokens == 0 and result.logprob_diff_max == 0.0  # nothing compared
    assert result.grad_norm == 0.0 and result.policy_version == 1
    assert_params_close(before, params(e), atol=0.0)  # zero gradient, fresh AdamW moments


def test_step_loss_and_grad_norm_equal_one_policy_loss_call(tiny: Path) -> None:
    batch = random_batch(n=5, seed=2)
    e = engine(tiny, micro_batch_tokens=24, max_grad_norm=None)
    model = copy.deepcopy(e.model)
    result = e.step(batch)

    n = max(len(s.input_ids) for s in batch.samples)
    ids = torch.zeros(len(batch.items), n, dtype=torch.long)
    mask = torch.zeros(len(batch.items), n)
    for row, sample in enumerate(batch.samples):
        ids[row, : len(sample.input_ids)] = torch.tensor(sample.input_ids)
        mask[row, : len(sample.input_ids)] = torch.tensor(sample.loss_mask, dtype=torch.float)
    advantages = torch.tensor([a for _, a in batch.items])
    logprobs = losses.sequence_logprobs(model(input_ids=ids).logits, ids)
    loss, _ = losses.policy_loss(logprobs, logprobs.detach(), advantages, mask)
    loss.backward()
    norm = torch.sqrt(sum(p.grad.square().sum() for p in model.parameters()))  # type: ignore[misc,union-attr]
    assert result.loss == pytest.approx(float(loss.detach()), abs=1e-6)
    assert result.grad_norm == pytest.approx(float(norm), rel=1e-5)
    assert result.tokens == sum(len(s.input_ids) for s in batch.samples)
    assert result.trained_tokens == batch.trained_tokens
    assert result.policy_version == e.policy_version == 1


def test_masked_tokens_get_exactly_zero_gradient(tiny: Path) -> None:
    batch = random_batch(n=4, seed=3)
    # masked positions hold garbage behaviour logprobs: they must not matter at all
    items = [
        (
            s.model_copy(
                update={
                    "logprobs": [
                        lp if m else -math.inf
                        for lp, m in zip(s.logprobs, s.loss_mask, strict=True)
                    ]
                }
            ),
            a,
        )
        for s, a in batch.items
    ]
    e = engine(tiny, loss={"options": {"tis": True}})
    grads = capture_hidden_grads(e)
    result = e.step(TrainBatch(items=items))
    assert math.isfinite(result.loss) and math.isfinite(result.grad_norm)
    (grad,) = grads  # one micro-batch
    order = sorted(range(len(items)), key=lambda i: -len(items[i][0].input_ids))
    for row, i in enumerate(order):
        mask = items[i][0].loss_mask
        # hidden state t - 1 predicts token t: it gets gradient only where token t is trained
        predicts_trained = torch.tensor(mask[1:] + [0] * (grad.shape[1] - len(mask) + 1)).bool()
        assert torch.count_nonzero(grad[row][~predicts_trained]) == 0
        assert torch.count_nonzero(grad[row][predicts_trained]) > 0


def test_compute_logprobs_match_a_plain_forward(tiny: Path) -> None:
    e = engine(tiny, micro_batch_tokens=20)
    samples = random_batch(n=5, seed=4).samples
    got = e.compute_logprobs(samples)
    for sample, row in zip(samples, got, strict=True):
        ids = torch.tensor([sample.input_ids])
        logits = e.model(input_ids=ids).logits[0]
        expected = [0.0] + [
            float(torch.log_softmax(logits[t - 1].detach(), -1)[sample.input_ids[t]])
            for t in range(1, len(sample.input_ids))
        ]
        assert row == pytest.approx(expected, abs=1e-5)


def test_logprob_agreement_probe(tiny: Path) -> None:
    e = engine(tiny)
    batch = random_batch(n=4, seed=5)
    # behaviour logprobs taken from the trainer itself: the probe reads ~0
    own = e.compute_logprobs(batch.samples)
    items = [
        (s.model_copy(update={"logprobs": lp}), a)
        for (s, a), lp in zip(batch.items, own, strict=True)
    ]
    trained = TrainBatch(items=items).trained_tokens
    agreement = logprob_agreement([s for s, _ in items], own)
    assert agreement == {"mean": 0.0, "max": 0.0, "tokens": trained}
    result = e.step(TrainBatch(items=items))
    assert result.logprob_diff_max < 1e-5
    # one trained token off by 0.5: max says 0.5, mean says 0.5 / trained tokens
    sample, advantage = items[0]
    t = sample.loss_mask.index(1)
    shifted = sample.model_copy(
        update={
            "logprobs": [*sample.logprobs[:t], sample.logprobs[t] - 0.5, *sample.logprobs[t + 1 :]]
        }
    )
    e2 = engine(tiny)
    result = e2.step(TrainBatch(items=[(shifted, advantage), *items[1:]]))
    assert result.logprob_diff_max == pytest.approx(0.5, abs=1e-5)
    assert result.logprob_diff_mean == pytest.approx(0.5 / trained, abs=1e-5)


def test_lr_schedules() -> None:
    s = TrainerConfig(warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    factors = [lr_factor(k, s, 6) for k in range(8)]
    assert factors[:2] == [0.5, 1.0]
    assert factors[2] == pytest.approx(1.0)
    assert factors[4] == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the decay
    assert factors[6:] == pytest.approx([0.1, 0.1])
    s = TrainerConfig(schedule="linear")
    assert [lr_factor(k, s, 4) for k in range(5)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])
    assert lr_factor(100, TrainerConfig()) == 1.0
    with pytest.raises(ValueError, match="total_steps"):
        lr_factor(3, TrainerConfig(schedule="cosine"))


def test_step_reports_the_scheduled_lr(tiny: Path) -> None:
    e = engine(tiny, lr=0.01, warmup_steps=2, schedule="linear", total_steps=4)
    batch = random_batch(n=2, seed=6)
    lrs = [e.step(batch).lr for _ in range(4)]
    # warm-up 1/2, 2/2, then linear decay over the remaining 2 steps: 1, 1/2
    assert lrs == pytest.approx([0.005, 0.01, 0.01, 0.005])


def test_lora_trains_only_adapters_and_exports_merged_weights(tiny: Path) -> None:
    from transformers import AutoModelForCausalLM

    e = engine(tiny, lora={"enabled": True, "r": 4, "alpha": 8})
    base = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    frozen = {n: p.detach().clone() for n, p in e.model.named_parameters() if not p.requires_grad}
    e.step(random_batch(n=3, seed=7))
    for name, p in e.model.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name
    exported = dict(e.export_weights())
    assert set(exported) == set(base)
    merged = copy.deepcopy(e.model).merge_and_unload().state_dict()  # type: ignore[operator]
    assert set(merged) == set(base)
    changed = set()
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, merged[name], atol=1e-6, rtol=0)
        if not torch.equal(tensor, base[name]):
            changed.add(name.rsplit(".", 2)[-2])
    # the export differs from the base exactly where adapters trained
    assert changed == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_train_last_layers_freezes_below_and_updates_the_top_as_full_training_would(
    tiny: Path,
) -> None:
    batch = random_batch(n=3, seed=9)
    full, top = (
        engine(tiny, max_grad_norm=None),
        engine(tiny, max_grad_norm=None, train_last_layers=1),
    )
    before = params(top)
    full.step(batch)
    top.step(batch)
    trained = {n for n, p in top.model.named_parameters() if p.requires_grad}
    assert trained and all(n.startswith(("model.layers.1.", "model.norm.")) for n in trained)
    assert "model.norm.weight" in trained
    after_full, after_top = params(full), params(top)
    for name, value in after_top.items():
        if name in trained:
            # the same gradient as full training for the trained part: the same AdamW update
            torch.testing.assert_close(value, after_full[name], atol=1e-6, rtol=0)
            assert not torch.equal(value, before[name]), name
        else:
            assert torch.equal(value, before[name]), name
    # no optimizer state for frozen weights
    assert len(top.optimizer.state) == len(trained)


def test_train_last_layers_puts_lora_adapters_on_those_blocks_only(tiny: Path) -> None:
    e = engine(tiny, lora={"enabled": True, "r": 4, "alpha": 8}, train_last_layers=1)
    adapted = {n for n, p in e.model.named_parameters() if p.requires_grad}
    assert adapted and all(".layers.1." in n and ".lora_" in n for n in adapted)


def test_train_last_layers_beyond_the_model_is_an_error(tiny: Path) -> None:
    with pytest.raises(ValueError, match="train_last_layers=3 but the model has 2 decoder blocks"):
        engine(tiny, train_last_layers=3)


def test_gradient_checkpointing_and_bf16(tiny: Path) -> None:
    batch = random_batch(n=4, seed=8)
    plain, checkpointed = engine(tiny), engine(tiny, gradient_checkpointing=True)
    plain.step(batch)
    checkpointed.step(batch)
    assert_params_close(params(plain), params(checkpointed), atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the emulated-bf16 warning of an AVX2 CPU
        result = engine(tiny, dtype="bfloat16").step(batch)
    assert math.isfinite(result.loss) and math.isfinite(result.grad_norm)


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    raise AssertionError("no flags line in /proc/cpuinfo")


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="reads the CPU flags of Linux")
def test_dtype_auto_trains_in_bf16_only_where_the_cpu_has_it(tiny: Path) -> None:
    # An AVX2 CPU emulates bf16 (15x slower than float32 here): auto must pick float32 there,
    # bf16 on a CPU with AVX512-BF16 or AMX. The kernel's flags are the independent witness.
    flags = _cpu_flags()
    native = bool({"avx512_bf16", "amx_bf16"} & flags) and os.environ.get(
        "CONVEYOR_NO_BF16", ""
    ) in ("", "0")
    assert native_bf16(torch.device("cpu")) is native
    auto = engine(tiny, dtype="auto")
    assert TrainerConfig().dtype == "auto"
    assert auto._autocast_dtype is (torch.bfloat16 if native else None)
    assert engine(tiny, dtype="float32")._autocast_dtype is None
    if not native:
        with pytest.warns(UserWarning, match="emulated"):
            forced = engine(tiny, dtype="bfloat16")
        assert forced._autocast_dtype is torch.bfloat16


def test_conveyor_no_bf16_makes_auto_train_in_float32(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "bf16 off" timing switch: auto picks float32 even where the CPU has bf16."""
    monkeypatch.setenv("CONVEYOR_NO_BF16", "1")
    assert native_bf16(torch.device("cpu")) is False
    assert engine(tiny, dtype="auto")._autocast_dtype is None
    monkeypatch.setenv("CONVEYOR_NO_BF16", "0")
    assert native_bf16(torch.device("cpu")) is bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())


def test_bad_batches_are_errors(tiny: Path) -> None:
    with pytest.raises(ValueError, match="empty"):
        engine(tiny).step(TrainBatch(items=[]))
    sample = TrainingSample(input_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0], prompt_length=1)
    with pytest.raises(ValueError, match="aligned"):
        TrainBatch(items=[(sample, 1.0)])


@pytest.mark.slow
def test_one_step_of_the_real_model() -> None:
    from transformers import AutoTokenizer

    from conveyor.models import default_model_dir

    folder = default_model_dir()
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"the embedded model is not prepared at {folder} (conveyor models prepare)")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    e = TorchTrainingEngine(folder, TrainerConfig(lr=1e-5, device="cpu", micro_batch_tokens=8192))
    samples = []
    for question, answer in [("What is 2 + 3?", "2 + 3 = 5."), ("Name a colour.", "Blue.")]:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        completion = tokenizer.encode(answer + "<|im_end|>", add_special_tokens=False)
        tail = tokenizer.encode("\n<|im_start|>user\nok", add_special_tokens=False)
        ids = [*prompt, *completion, *tail]
        mask = [0] * len(prompt) + [1] * len(completion) + [0] * len(tail)
        samples.append(
            TrainingSample(
                input_ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids), prompt_length=len(prompt)
            )
        )
    own = e.compute_logprobs(samples)
    items = [
        (s.model_copy(update={"logprobs": lp}), adv)
        for s, lp, adv in zip(samples, own, [1.0, -1.0], strict=True)
    ]
    grads = capture_hidden_grads(e)
    before = params(e)
    result = e.step(TrainBatch(items=items))
    assert math.isfinite(result.loss) and 0.0 < result.grad_norm < math.inf
    assert result.logprob_diff_max < 1e-3  # behaviour logprobs came from this very model
    assert any(not torch.equal(before[n], p) for n, p in params(e).items())
    (grad,) = grads
    order = sorted(range(2), key=lambda i: -len(samples[i].input_ids))
    for row, i in enumerate(order):
        mask = samples[i].loss_mask
        predicts_trained = torch.tensor(mask[1:] + [0] * (grad.shape[1] - len(mask) + 1)).bool()
        assert torch.count_nonzero(grad[row][~predicts_trained]) == 0
        assert torch.count_nonzero(grad[row][predicts_trained]) > 0


def test_weight_fingerprint_digests_named_exports_in_their_dtype_and_probes_at_temperature_1(
    tiny: Path,
) -> None:
    from conveyor.engines.base import WeightFingerprint, tensor_digest

    e = engine(tiny, temperature=0.7)
    exported = {name: t.clone() for name, t in e.export_weights()}
    norm = "model.norm.weight"
    like = WeightFingerprint(
        policy_version=0,
        digests={norm: "", "model.embed_tokens.weight": "", "engine.only.fused": ""},
        dtypes={norm: "bfloat16", "model.embed_tokens.weight": "float32"},
    )
    probe = [5, 9, 17, 33, 2]
    got = e.weight_fingerprint(like, probe)
    # a name the trainer does not export drops out (the comparison skips it)
    assert set(got.digests) == {norm, "model.embed_tokens.weight"}
    assert got.digests[norm] == tensor_digest(exported[norm], "bfloat16")
    assert got.digests[norm] != tensor_digest(exported[norm], "float32")
    assert got.shapes[norm] == list(exported[norm].shape)
    # the probe is the served distribution at temperature 1, whatever the trainer's temperature
    sample = TrainingSample(input_ids=probe, loss_mask=[1] * 5, logprobs=[0.0] * 5, prompt_length=0)
    at_one = engine(tiny, temperature=1.0).compute_logprobs([sample])[0]
    at_07 = e.compute_logprobs([sample])[0]
    assert got.probe_logprobs == pytest.approx(at_one, abs=1e-6)
    assert got.probe_logprobs != pytest.approx(at_07, abs=1e-3)
    assert got.probe_logprobs[0] == 0.0 and got.policy_version == e.policy_version


@pytest.mark.parametrize(
    ("sets", "warm_start_trains", "rl_trains"),
    [
        (["trainer.train_last_layers=1"], "top", "top"),  # the warm start inherits by default
        (["trainer.train_last_layers=1", "rl.warm_start.train_last_layers=all"], "all", "top"),
        (["rl.warm_start.train_last_layers=1"], "top", "all"),
        # `all` is full fine-tuning: a LoRA run's warm start trains every weight, no adapters
        (["trainer.lora.enabled=true", "rl.warm_start.train_last_layers=all"], "all", "lora"),
        (["trainer.lora.enabled=true"], "lora", "lora"),
    ],
)
def test_the_warm_start_trains_the_blocks_rl_sft_train_last_layers_names(
    tiny: Path, sets: list[str], warm_start_trains: str, rl_trains: str
) -> None:
    """Through the config loader and the real engine on a two-block model."""
    from conveyor.app.train import warm_start_settings
    from conveyor.config import load_config

    config = load_config(None, [*sets, "trainer.device=cpu", "rl.warm_start.lr=3.0e-4"]).config
    plain = config.trainer.model_copy(
        update={"lora": config.trainer.lora.model_copy(update={"enabled": False})}
    )
    everything = {n for n, _ in TorchTrainingEngine(tiny, plain).model.named_parameters()}

    def trained(settings: TrainerConfig) -> str:
        names = {
            n
            for n, p in TorchTrainingEngine(tiny, settings).model.named_parameters()
            if p.requires_grad
        }
        if names == everything:
            return "all"
        if names and all("lora_" in n for n in names):
            return "lora"
        assert names and all(n.startswith(("model.layers.1.", "model.norm.")) for n in names)
        return "top"

    warm = warm_start_settings(config)
    assert warm.lr == 3e-4 and isinstance(warm.loss.options, LossConfig)
    assert not warm.loss.options.tis
    assert (trained(warm), trained(config.trainer)) == (warm_start_trains, rl_trains)
    with pytest.raises(ConfigError, match=r"rl\.warm_start\.train_last_layers"):
        load_config(None, ["rl.warm_start.train_last_layers=0"])
