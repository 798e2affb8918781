"""Micro-batch planning by padded-token budget, and dealing micro-batches to ranks."""

from __future__ import annotations

import random

import pytest

from conveyor.trainer.batching import (
    MicroBatch,
    assign_to_ranks,
    plan_micro_batches,
    plan_packed_micro_batches,
)


def test_every_index_once_and_budget_respected() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 300) for _ in range(200)]
    plan = plan_micro_batches(lengths, max_tokens=512)
    seen = sorted(i for micro in plan for i in micro.indices)
    assert seen == list(range(len(lengths)))
    for micro in plan:
        assert micro.padded_length == max(lengths[i] for i in micro.indices)
        assert micro.padded_tokens <= 512


def test_longest_first_packing() -> None:
    lengths = [10, 100, 12, 98, 11, 99]
    plan = plan_micro_batches(lengths, max_tokens=200)
    # sorted longest first and packed greedily: 100+99 | 98+12 (2 x 98 fits) | 11+10
    assert [sorted(m.indices) for m in plan] == [[1, 5], [2, 3], [0, 4]]
    assert [m.padded_length for m in plan] == [100, 98, 11]


def test_overlong_sequence_gets_its_own_micro_batch() -> None:
    plan = plan_micro_batches([5, 700, 5], max_tokens=64)
    assert plan[0] == MicroBatch((1,), 700)
    assert plan[1] == MicroBatch((0, 2), 5)


def test_bad_inputs_are_errors() -> None:
    with pytest.raises(ValueError, match="empty"):
        plan_micro_batches([3, 0], max_tokens=8)
    with pytest.raises(ValueError, match="positive"):
        plan_micro_batches([3], max_tokens=0)
    with pytest.raises(ValueError, match="positive"):
        assign_to_ranks([], world_size=0)


def test_assign_to_ranks_balances_tokens_and_keeps_everything() -> None:
    plan = [MicroBatch((i,), n) for i, n in enumerate([100, 90, 50, 40, 30, 10])]
    ranks = assign_to_ranks(plan, world_size=2)
    loads = [sum(m.padded_tokens for m in r) for r in ranks]
    # largest first onto the least-loaded rank: 100+40+30 and 90+50+10
    assert sorted(loads) == [150, 170]
    assert sorted(m.indices[0] for r in ranks for m in r) == list(range(6))
    # more ranks than work: some ranks get nothing (the engine pads them with empty passes)
    assert [len(r) for r in assign_to_ranks(plan[:1], world_size=3)] == [1, 0, 0]


def test_packed_plan_budgets_real_tokens_first_fit_longest_first() -> None:
    lengths = [10, 100, 12, 98, 11, 99, 150]
    plan = plan_packed_micro_batches(lengths, max_tokens=200)
    # longest first, each into the first micro-batch with room: 150 | 100, then 99 (199) | 98;
    # 12, 11 and 10 all fit after 150 (183)
    assert [m.indices for m in plan] == [(6, 2, 4, 0), (1, 5), (3,)]
    assert [m.packed_tokens for m in plan] == [183, 199, 98]
    assert [m.padded_tokens for m in plan] == [183, 199, 98]  # a packed row has no padding
    assert [m.padded_length for m in plan] == [150, 100, 98]
    # the padded planner on the same budget needs more passes and pads them
    padded = plan_micro_batches(lengths, max_tokens=200)
    assert len(padded) > len(plan)
    assert sum(m.padded_tokens for m in padded) > sum(lengths)


def test_packed_plan_every_index_once_within_budget() -> None:
    rng = random.Random(1)
    lengths = [rng.randint(1, 300) for _ in range(200)]
    plan = plan_packed_micro_batches(lengths, max_tokens=512)
    assert sorted(i for m in plan for i in m.indices) == list(range(200))
    for m in plan:
        assert m.packed_tokens == sum(lengths[i] for i in m.indices) <= 512
    assert plan_packed_micro_batches([600, 5], max_tokens=512)[0].indices == (0,)  # over budget
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        plan_packed_micro_batches([3, 0], max_tokens=8)
