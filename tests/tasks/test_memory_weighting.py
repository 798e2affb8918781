"""How the samples of one memory trajectory weigh in the policy loss (issue 17's acceptance test).

A memory rollout resets its context at every chunk, so one trajectory becomes several training
samples (`Turn.sample_index`). Every sample takes the trajectory's advantage, computed once from
the final answer; how much each sample then weighs depends on the loss reduction. The batch here
is built by hand and goes through the real code: `Trajectory.samples`, the RL loop's
`build_batch` (status selection, advantages, `assign_to_samples`) and one real
`TorchTrainingEngine.step` on a tiny random Llama. A hook on the trainer's per-token logprobs
reads d(batch loss)/d(logprob of each token); on the first update the PPO ratio is exactly 1,
so that gradient is `-advantage * weight` and the weight of every token can be compared with the
hand-computed table (the same table is in docs/domains/memory.md).

The batch: one group of two rollouts of one memory task.
- the memory trajectory (reward 1): three contexts, i.e. three samples, with 2, 3 and 5 trained
  tokens (the third context has two turns: 2 + 3 tokens around a 2-token tool reply);
  lengths 3+2 = 5, 4+3 = 7 and 3+2+2+3 = 10 tokens;
- an ordinary trajectory (reward 0, it answered at once): one sample, 4 trained tokens, length
  2+4 = 6.
RLOO over the group's rewards [1, 0]: A = 1 - 0 = +1 for the memory trajectory, 0 - 1 = -1 for
the other. So the items are (s0, +1), (s1, +1), (s2, +1), (s3, -1): B = 4 samples,
n = [2, 3, 5, 4] trained tokens, N = 14 in all, longest sequence L = 10.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch

from conveyor.config import ConveyorConfig, LossConfig, RLConfig, TrainerConfig
from conveyor.trainer.backend import TrainBatch
from conveyor.trainer.batching import MicroBatch
from conveyor.trainer.engine import TorchTrainingEngine
from conveyor.trainer.loop import RLLoop
from conveyor.trainer.policy_losses import PPOClip
from conveyor.types import Trajectory, TrajectoryGroup, Turn

F = Fraction

# Per-token weight of each sample's trained tokens, computed by hand (B = 4, N = 14, L = 10):
# - token_mean: every trained token of the batch weighs 1/N = 1/14, so a sample weighs n_i/14
#   and the memory trajectory (2 + 3 + 5 = 10 tokens) 10/14 = 5/7, the other 4/14 = 2/7;
# - seq_mean_token_mean: each sample weighs 1/B = 1/4, spread over its n_i tokens: 1/(4 n_i),
#   i.e. 1/8, 1/12, 1/20 and 1/16; the memory trajectory weighs 3/4 (one quarter per
#   context), the other 1/4;
# - seq_mean_token_sum_norm: every trained token weighs 1/(B L) = 1/40 (Dr. GRPO's constant
#   divisor), so samples weigh 2/40, 3/40, 5/40 and 4/40; the memory trajectory 10/40 = 1/4,
#   the other 4/40 = 1/10 (these need not sum to 1).
TABLE: dict[str, list[Fraction]] = {
    "token_mean": [F(1, 14), F(1, 14), F(1, 14), F(1, 14)],
    "seq_mean_token_mean": [F(1, 8), F(1, 12), F(1, 20), F(1, 16)],
    "seq_mean_token_sum_norm": [F(1, 40), F(1, 40), F(1, 40), F(1, 40)],
}
TRAJECTORY_WEIGHT: dict[str, tuple[Fraction, Fraction]] = {
    "token_mean": (F(5, 7), F(2, 7)),
    "seq_mean_token_mean": (F(3, 4), F(1, 4)),
    "seq_mean_token_sum_norm": (F(1, 4), F(1, 10)),
}


def turn(prompt: list[int], completion: list[int], sample_index: int) -> Turn:
    return Turn(
        prompt_ids=prompt,
        completion_ids=completion,
        completion_logprobs=[-1.0] * len(completion),
        loss_mask=[1] * len(completion),
        sample_index=sample_index,
    )


def memory_trajectory() -> Trajectory:
    """Three contexts: sample 0 and 1 one turn each, sample 2 two turns around a tool reply."""
    return Trajectory(
        task_id="memory-eval-0000",
        sample_index=0,
        turns=[
            turn([10, 11, 12], [20, 21], 0),
            turn([13, 14, 15, 16], [22, 23, 24], 1),
            turn([17, 18, 19], [25, 26], 2),
            turn([17, 18, 19, 25, 26, 30, 31], [27, 28, 29], 2),
        ],
        reward=1.0,
        counters={"resets": 2, "splits": 0},
    )


def ordinary_trajectory() -> Trajectory:
    return Trajectory(
        task_id="memory-eval-0000",
        sample_index=1,
        turns=[turn([40, 41], [42, 43, 44, 45], 0)],
        reward=0.0,
    )


def expected_weights(reduction: str) -> list[list[Fraction]]:
    """Per position of each sample: the table's weight on trained tokens, 0 elsewhere."""
    samples = [*memory_trajectory().samples(), *ordinary_trajectory().samples()]
    return [
        [TABLE[reduction][i] if m else F(0) for m in sample.loss_mask]
        for i, sample in enumerate(samples)
    ]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide random Llama (the weights do not matter: at ratio 1 the gradient with
    respect to each logprob is fixed by the advantages and the reduction alone)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-weighting")
    shape = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(shape).save_pretrained(folder)
    return folder


def config(reduction: str, micro_batch_tokens: int) -> ConveyorConfig:
    return ConveyorConfig(
        rl=RLConfig(advantage="rloo"),
        trainer=TrainerConfig(
            lr=1e-3,
            device="cpu",
            micro_batch_tokens=micro_batch_tokens,
            loss={"options": LossConfig(reduction=reduction)},  # type: ignore[arg-type]
        ),
    )


def record_token_weights(
    monkeypatch: pytest.MonkeyPatch,
    backend: TorchTrainingEngine,
    batch: TrainBatch,
    expected_micro_batches: int,
) -> Callable[[], list[list[float]]]:
    """Hooks on the engine: which items each micro-batch holds, and d loss / d logprobs of each
    micro-batch (scaled by the engine's share of the batch denominator, as in its backward).
    Returns a reader of `-grad / advantage` per item, cut to the item's length."""
    micros: list[MicroBatch] = []
    grads: list[torch.Tensor] = []
    real_collate = backend._collate
    real_loss = backend.loss
    assert isinstance(real_loss, PPOClip)

    class Hooked(PPOClip):
        def __call__(self, logprobs: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            logprobs.register_hook(lambda grad: grads.append(grad.detach().clone()))
            return super().__call__(logprobs, *args, **kwargs)

    def collate(batch: TrainBatch, micro: MicroBatch) -> Any:
        micros.append(micro)
        return real_collate(batch, micro)

    monkeypatch.setattr(backend, "_collate", collate)
    monkeypatch.setattr(backend, "loss", Hooked(real_loss.settings))

    def read() -> list[list[float]]:
        assert len(micros) == len(grads) == expected_micro_batches
        out: list[list[float]] = [[] for _ in batch.items]
        for micro, grad in zip(micros, grads, strict=True):
            for row, i in enumerate(micro.indices):
                sample, advantage = batch.items[i]
                out[i] = (-grad[row, : len(sample.input_ids)] / advantage).tolist()
        return out

    return read


def test_each_context_is_a_sample_with_the_trajectorys_advantage(tmp_path: Path) -> None:
    memory = memory_trajectory()
    samples = memory.samples()
    assert [len(s.input_ids) for s in samples] == [5, 7, 10]
    assert [sum(s.loss_mask) for s in samples] == [2, 3, 5]
    # the two-turn context: prompt, 2 trained, 2 tool tokens (mask 0), 3 trained
    assert samples[2].loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    group = TrajectoryGroup(task_id=memory.task_id, trajectories=[memory, ordinary_trajectory()])
    loop = RLLoop(config("token_mean", 4096), None, _Version(), None, [], tmp_path)  # type: ignore[arg-type]
    batch, metrics = loop.build_batch([group])
    assert metrics["samples"] == 4.0
    assert [a for _, a in batch.items] == [1.0, 1.0, 1.0, -1.0]
    assert [s.input_ids for s, _ in batch.items] == [
        *[s.input_ids for s in samples],
        [40, 41, 42, 43, 44, 45],
    ]


class _Version:
    """The one thing `build_batch` asks of the backend."""

    policy_version = 0


@pytest.mark.parametrize("micro_batch_tokens", [4096, 10])
@pytest.mark.parametrize("reduction", list(TABLE))
def test_token_weights_equal_the_hand_computed_table(
    tiny: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    reduction: str,
    micro_batch_tokens: int,
) -> None:
    settings = config(reduction, micro_batch_tokens)
    backend = TorchTrainingEngine(tiny, settings.trainer)
    loop = RLLoop(settings, None, backend, None, [], tmp_path)  # type: ignore[arg-type]
    group = TrajectoryGroup(
        task_id="memory-eval-0000", trajectories=[memory_trajectory(), ordinary_trajectory()]
    )
    batch, _ = loop.build_batch([group])
    # 28 tokens in 4096 is one micro-batch; a budget of 10 gives each sample its own, and the
    # engine's global normalisation must give the same weights
    read = record_token_weights(monkeypatch, backend, batch, 1 if micro_batch_tokens > 28 else 4)
    backend.step(batch)
    got = read()
    want = expected_weights(reduction)
    for i, (row, expected) in enumerate(zip(got, want, strict=True)):
        assert row == pytest.approx([float(w) for w in expected], rel=1e-5, abs=1e-7), i
    memory_total = sum(sum(row) for row in got[:3])
    other_total = sum(got[3])
    want_memory, want_other = TRAJECTORY_WEIGHT[reduction]
    assert memory_total == pytest.approx(float(want_memory), rel=1e-5)
    assert other_total == pytest.approx(float(want_other), rel=1e-5)
    # the table's per-sample sums agree with the per-trajectory column
    per_sample = [sum(w) for w in want]
    assert sum(per_sample[:3]) == want_memory and per_sample[3] == want_other
