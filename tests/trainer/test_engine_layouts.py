"""`trainer.packing` and `trainer.logits_chunk_tokens` in the engine: one training step (loss,
the logprobs it trains on, every gradient) and `compute_logprobs` equal the right-padded,
whole-logits step: on a tiny random Llama under LoRA, train_last_layers, temperature and
gradient checkpointing, and on real quickstart trajectories with the embedded SmolLM2-135M.
Models or settings the two cannot serve are refused at load, with the reason."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_llama import random_batch, save_tiny_llama

from conveyor.config import TrainerConfig
from conveyor.config import training as training_config
from conveyor.trainer.backend import StepResult, TrainBatch
from conveyor.trainer.batching import plan_micro_batches
from conveyor.trainer.engine import TorchTrainingEngine
from conveyor.types import TrainingSample

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def engine(folder: Path, **overrides: Any) -> TorchTrainingEngine:
    values: dict[str, Any] = {
        "lr": 1e-3,
        "seed": 0,
        "device": "cpu",
        "micro_batch_tokens": 40,
        "dtype": "float32",
        "max_grad_norm": None,
    }
    values.update(overrides)
    options = {key: values.pop(key) for key in ("temperature",) if key in values}
    return TorchTrainingEngine(folder, TrainerConfig(**values), **options)


def step_with_grads(e: TorchTrainingEngine, batch: TrainBatch) -> tuple[StepResult, dict]:
    """One step, and the gradient of every trained parameter as AdamW receives it."""
    grads: dict[str, torch.Tensor] = {}

    def keep(*_args: Any) -> None:
        for name, param in e.model.named_parameters():
            if param.grad is not None:
                grads[name] = param.grad.detach().clone()

    handle = e.optimizer.register_step_pre_hook(keep)
    try:
        result = e.step(batch)
    finally:
        handle.remove()
    return result, grads


def with_own_logprobs(e: TorchTrainingEngine, batch: TrainBatch) -> tuple[TrainBatch, list]:
    """`batch` whose behaviour logprobs are `e`'s own: another engine's step then reports, as
    `logprob_diff_max`, how far the logprobs it trains on are from `e`'s."""
    own = e.compute_logprobs(batch.samples)
    items = [
        (s.model_copy(update={"logprobs": lp}), a)
        for (s, a), lp in zip(batch.items, own, strict=True)
    ]
    return TrainBatch(items=items, ref_logprobs=batch.ref_logprobs), own


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def assert_same_step(
    reference: tuple[StepResult, dict],
    other: tuple[StepResult, dict],
    logprob_tol: float,
    grad_tol: float,
) -> None:
    (ref, ref_grads), (got, got_grads) = reference, other
    assert ref.logprob_diff_max < logprob_tol  # its own logprobs: the probe itself is exact
    assert got.logprob_diff_max < logprob_tol, got.logprob_diff_max
    assert got.loss == pytest.approx(ref.loss, abs=grad_tol)
    assert got.grad_norm == pytest.approx(ref.grad_norm, rel=1e-5)
    assert got.tokens == ref.tokens and got.trained_tokens == ref.trained_tokens
    assert got_grads.keys() == ref_grads.keys() and ref_grads
    worst = max(float((got_grads[n] - ref_grads[n]).abs().max()) for n in ref_grads)
    assert worst < grad_tol, f"max gradient difference {worst}"


def tiny_batch() -> TrainBatch:
    batch = random_batch(n=7, seed=11)
    silent = TrainingSample(
        input_ids=[1, 2, 3, 4], loss_mask=[0] * 4, logprobs=[0.0] * 4, prompt_length=4
    )
    items = [*batch.items, (silent, 0.5)]
    refs = [[-2.0 + 0.01 * t for t in range(len(s.input_ids))] for s, _ in items]
    return TrainBatch(items=items, ref_logprobs=refs)


VARIANTS: dict[str, dict[str, Any]] = {
    "full": {},
    "lora": {"lora": {"enabled": True, "r": 4}},
    "last_layer_lora": {"train_last_layers": 1, "lora": {"enabled": True, "r": 4}},
    "last_layer": {"train_last_layers": 1},
    "temperature": {"temperature": 0.7},
    "checkpointing": {"gradient_checkpointing": True},
}
LAYOUTS: dict[str, dict[str, Any]] = {
    "packed": {"packing": True},
    "chunked": {"logits_chunk_tokens": 5},
    "packed_chunked": {"packing": True, "logits_chunk_tokens": 7},
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_step_equals_the_padded_whole_logits_step(tiny: Path, variant: str, layout: str) -> None:
    settings = {
        **VARIANTS[variant],
        # a KL term: ref logprobs in the padded layout must meet the packed row's logprobs
        "loss": {"options": {"reduction": "seq_mean_token_mean", "kl_coef": 0.1}},
    }
    padded = engine(tiny, **settings)
    batch, own = with_own_logprobs(padded, tiny_batch())
    other = engine(tiny, **settings, **LAYOUTS[layout])
    assert max_diff(other.compute_logprobs(batch.samples), own) < 1e-6
    reference = step_with_grads(padded, batch)
    got = step_with_grads(other, batch)
    assert_same_step(reference, got, logprob_tol=1e-6, grad_tol=1e-6)


def test_packing_runs_fewer_passes_without_padding(tiny: Path) -> None:
    batch = tiny_batch()
    lengths = [len(s.input_ids) for s in batch.samples]
    seen: list[tuple[int, ...]] = []
    packed = engine(tiny, packing=True)
    packed.model.register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    packed.step(batch)
    assert all(rows == 1 for rows, _ in seen)  # one row per micro-batch
    assert sum(n for _, n in seen) == sum(lengths)  # every token once, no padding
    assert all(n <= 40 for _, n in seen)  # the budget counts real tokens
    padded = plan_micro_batches(lengths, 40)
    assert len(seen) < len(padded) and sum(m.padded_tokens for m in padded) > sum(lengths)


def test_bf16_autocast_packed_and_chunked_agree_with_padded(tiny: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the emulated-bf16 warning of an AVX2 CPU
        padded = engine(tiny, dtype="bfloat16")
        other = engine(tiny, dtype="bfloat16", packing=True, logits_chunk_tokens=6)
    batch, own = with_own_logprobs(padded, tiny_batch())
    # bf16 rounds differently per layout (8 mantissa bits): near, not equal
    assert max_diff(other.compute_logprobs(batch.samples), own) < 0.05
    ref, got = padded.step(batch), other.step(batch)
    assert math.isfinite(got.loss) and got.grad_norm == pytest.approx(ref.grad_norm, rel=0.05)


def test_packing_is_refused_where_transformers_would_not_mask_packed_rows(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import masking_utils

    # what a transformers without packed-sequence masks does: one causal mask over the row
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda _positions: None)
    with pytest.raises(ValueError, match=r"attend to each other .* set packing: false"):
        engine(tiny, packing=True)
    engine(tiny)  # the padded path does not depend on it


def test_packing_is_refused_at_config_load_with_an_old_transformers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conveyor.config import ConfigError, load_config

    assert training_config.packing_unsupported("4.56.0") is None
    assert training_config.packing_unsupported("5.19.0") is None
    assert "4.55.4" in str(training_config.packing_unsupported("4.55.4"))
    monkeypatch.setattr(training_config.metadata, "version", lambda _name: "4.52.1")
    with pytest.raises(ConfigError, match=r"trainer\.packing needs transformers >= 4\.56"):
        load_config(None, ["trainer.packing=true"])
    assert load_config(None, ["trainer.packing=false"]).config.trainer.packing is False


def test_chunked_logits_refuse_lora_on_the_lm_head(tiny: Path) -> None:
    lora = {"enabled": True, "target_modules": ["q_proj", "lm_head"]}
    with pytest.raises(ValueError, match=r"plain bias-free Linear.*LoRA on lm_head"):
        engine(tiny, lora=lora, logits_chunk_tokens=8)


def test_chunked_logits_refuse_a_model_whose_logits_are_softcapped(tmp_path: Path) -> None:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        final_logit_softcapping=0.5,  # tanh(logits / 0.5) * 0.5: not hidden @ W.T
    )
    Gemma2ForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="logits are not its final hidden states"):
        engine(tmp_path, logits_chunk_tokens=8)


# -- the embedded model on real quickstart trajectories ------------------------------------------


@pytest.fixture(scope="module")
def quickstart(model_dir: Path) -> TrainBatch:
    """Oracle traces of 4 quickstart (filenav) train instances: multi-turn, real tool output,
    the model's chat template; what the quickstart's warm start trains on."""
    from conveyor.bench.trainer import TrainerBenchSpec, quickstart_batch

    spec = TrainerBenchSpec(
        model_dir=str(model_dir),
        packing_tasks=4,
        packing_config=str(ROOT / "configs" / "filenav.yaml"),
    )
    batch, _, _ = quickstart_batch(spec)
    lengths = [len(s.input_ids) for s in batch.samples]
    assert len(lengths) >= 3 and len(set(lengths)) > 1  # the padded path pads
    assert all(sum(s.loss_mask) > 0 for s in batch.samples)
    return batch


@pytest.fixture(scope="module")
def real_reference(model_dir: Path, quickstart: TrainBatch) -> dict[str, Any]:
    padded = engine(model_dir, micro_batch_tokens=8192, lr=1e-5)
    batch, own = with_own_logprobs(padded, quickstart)
    return {"batch": batch, "own": own, "step": step_with_grads(padded, batch)}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("settings", "logprob_tol", "grad_tol"),
    # Packed logprobs: 2.1e-5 apart at most (1.8e-6 relative, at a logprob near -12; measured
    # 27 Nov): a sequence after the first in a ~2,000-position packed row goes through sdpa
    # with an explicit block-diagonal mask, the padded rows through its causal kernel over
    # 500 positions, which sum the same terms in other blocks over 30 layers. The first
    # sequence of the row is within 4.6e-7; loss equal to 1e-8, gradients within 1.7e-6.
    [({"packing": True}, 5e-5, 1e-5), ({"logits_chunk_tokens": 256}, 1e-6, 1e-5)],
    ids=["packed", "chunked"],
)
def test_real_trajectories_step_equals_the_padded_whole_logits_step(
    model_dir: Path,
    real_reference: dict[str, Any],
    settings: dict[str, Any],
    logprob_tol: float,
    grad_tol: float,
) -> None:
    batch = real_reference["batch"]
    other = engine(model_dir, micro_batch_tokens=8192, lr=1e-5, **settings)
    assert max_diff(other.compute_logprobs(batch.samples), real_reference["own"]) < logprob_tol
    assert_same_step(real_reference["step"], step_with_grads(other, batch), logprob_tol, grad_tol)
