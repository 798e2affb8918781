"""Advantage estimators against hand-computed values, and their assignment to training samples."""

from __future__ import annotations

import math

import pytest

from conveyor.registry import ADVANTAGES
from conveyor.trainer.advantages import (
    GRPO,
    assign_to_samples,
    get_advantage,
    group_rewards,
    register_advantage,
)
from conveyor.types import Status, Trajectory, TrajectoryGroup, Turn


def trajectory(reward: float | None, samples: int = 1, index: int = 0) -> Trajectory:
    """A trajectory of `samples` training samples, each one turn with a distinct completion."""
    turns = [
        Turn(
            prompt_ids=[100 + s, 101],
            completion_ids=[10 * s + 1, 10 * s + 2],
            completion_logprobs=[-0.5, -0.25],
            loss_mask=[1, 1],
            sample_index=s,
        )
        for s in range(samples)
    ]
    return Trajectory(task_id="t", sample_index=index, turns=turns, reward=reward)


def test_registry_names_and_options() -> None:
    assert {"grpo", "rloo", "reinforce_pp"} <= set(ADVANTAGES.names())
    estimator = get_advantage("grpo", scale_by_std=False)
    assert isinstance(estimator, GRPO) and estimator.scale_by_std is False
    assert estimator.name == "grpo"
    with pytest.raises(KeyError, match="known"):
        get_advantage("ppo_gae")
    with pytest.raises(ValueError, match=r"rl\.advantage\.options\.scale_by_std"):
        get_advantage("rloo", scale_by_std=True)  # rloo has no such option: fail loud
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(type("Other", (), {}))


def test_grpo_scaled_by_std() -> None:
    grpo = get_advantage("grpo", eps=0.0)
    # [1, 0, 0, 1]: mean 0.5, population std 0.5 -> +-1
    # [1, 0, 0]: mean 1/3, std sqrt(2)/3 -> (2/3) / (sqrt(2)/3) = sqrt(2), (-1/3) / ... = -1/sqrt(2)
    out = grpo([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert out[0] == pytest.approx([1.0, -1.0, -1.0, 1.0])
    assert out[1] == pytest.approx([math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)])


def test_grpo_default_eps_and_unscaled() -> None:
    # default eps 1e-6: 0.5 / (0.5 + 1e-6)
    assert get_advantage("grpo")([[1.0, 0.0]]) == [pytest.approx([0.5 / 0.500001, -0.5 / 0.500001])]
    assert get_advantage("grpo", scale_by_std=False)([[3.0, 1.0, 2.0]]) == [[1.0, -1.0, 0.0]]


def test_grpo_degenerate_groups_get_zero_not_nan() -> None:
    out = get_advantage("grpo")([[0.7], [1.0, 1.0, 1.0], []])
    assert out == [[0.0], [0.0, 0.0, 0.0], []]


def test_rloo_leave_one_out() -> None:
    rloo = get_advantage("rloo")
    # [1, 0, 0, 1]: 1 - (0 + 0 + 1) / 3 = 2/3 and 0 - (1 + 0 + 1) / 3 = -2/3
    # [3, 1]: 3 - 1 = 2 and 1 - 3 = -2;  a single trajectory has no baseline -> 0
    out = rloo([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0], [5.0]])
    assert out[0] == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert out[1] == [2.0, -2.0]
    assert out[2] == [0.0]


def test_reinforce_pp_uses_the_batch_not_the_group() -> None:
    # batch [1, 0, 1, 1]: mean 0.75, population std sqrt(3)/4
    # -> 0.25 / (sqrt(3)/4) = 1/sqrt(3) and -0.75 / (sqrt(3)/4) = -sqrt(3)
    out = get_advantage("reinforce_pp", eps=0.0)([[1.0, 0.0], [1.0, 1.0]])
    third = 1 / math.sqrt(3)
    assert out[0] == pytest.approx([third, -math.sqrt(3)])
    # the all-ones group still gets a signal, unlike with grpo
    assert out[1] == pytest.approx([third, third])
    assert get_advantage("reinforce_pp")([[2.0], [2.0]]) == [[0.0], [0.0]]


def test_fixed_baseline_subtracts_a_constant_so_equal_rewards_still_train() -> None:
    out = get_advantage("fixed_baseline", baseline=0.5)([[0.0, 0.0], [1.0], []])
    assert out == [[-0.5, -0.5], [0.5], []]
    assert get_advantage("fixed_baseline")([[0.25, 1.0]]) == [[0.25, 1.0]]


def test_split_trajectory_counts_once_in_baseline_and_advantage_reaches_each_sample() -> None:
    split = trajectory(1.0, samples=2, index=0)
    single = trajectory(0.0, samples=1, index=1)
    groups = [TrajectoryGroup(task_id="t", trajectories=[split, single])]
    rewards = group_rewards(groups)
    assert rewards == [[1.0, 0.0]]
    # counted per trajectory: mean 0.5 -> +-0.5 (per sample it would be mean 2/3)
    advantages = get_advantage("grpo", scale_by_std=False)(rewards)
    assert advantages == [[0.5, -0.5]]
    pairs = assign_to_samples(groups, advantages)
    assert [(sample.input_ids, adv) for sample, adv in pairs] == [
        ([100, 101, 1, 2], 0.5),
        ([101, 101, 11, 12], 0.5),
        ([100, 101, 1, 2], -0.5),
    ]


def test_assign_skips_untrainable_and_checks_lengths() -> None:
    groups = [TrajectoryGroup(task_id="t", trajectories=[trajectory(1.0), trajectory(0.0)])]
    pairs = assign_to_samples(groups, [[1.0, -1.0]], trainable=[[False, True]])
    assert [adv for _, adv in pairs] == [-1.0]
    with pytest.raises(ValueError, match="2 trajectories, 1 advantages"):
        assign_to_samples(groups, [[1.0]])
    with pytest.raises(ValueError, match="advantage groups"):
        assign_to_samples(groups, [])


def test_missing_reward_is_an_error_not_zero() -> None:
    unscored = Trajectory(task_id="t", reward=None, status=Status.INFRA_ERROR)
    with pytest.raises(ValueError, match="no reward"):
        group_rewards([TrajectoryGroup(task_id="t", trajectories=[trajectory(1.0), unscored])])


def test_shuffled_rewards_permute_the_steps_rewards_and_nothing_else() -> None:
    from conveyor.trainer.advantages import shuffled_rewards
    from conveyor.types import Status, Trajectory, TrajectoryGroup

    def traj(task: str, i: int, reward: float | None) -> Trajectory:
        status = Status.OK if reward is not None else Status.INFRA_ERROR
        return Trajectory(task_id=task, sample_index=i, reward=reward, status=status)

    groups = [
        TrajectoryGroup(
            task_id=f"t{g}", trajectories=[traj(f"t{g}", i, float(g == i)) for i in range(4)]
        )
        for g in range(4)
    ] + [TrajectoryGroup(task_id="t9", trajectories=[traj("t9", 0, None), traj("t9", 1, 0.5)])]
    flat = lambda gs: [t.reward for g in gs for t in g.trajectories]  # noqa: E731
    first = shuffled_rewards(groups, seed=0, step=1)
    assert sorted(r for r in flat(first) if r is not None) == sorted(
        r for r in flat(groups) if r is not None
    )
    assert flat(first)[16] is None  # no reward stays none: infra errors are not scored
    assert flat(first) != flat(groups)
    assert flat(shuffled_rewards(groups, seed=0, step=1)) == flat(first)  # seeded
    assert flat(shuffled_rewards(groups, seed=0, step=2)) != flat(first)  # a new draw per step
    assert [(t.task_id, t.sample_index, t.status) for g in first for t in g.trajectories] == [
        (t.task_id, t.sample_index, t.status) for g in groups for t in g.trajectories
    ]
    assert flat(groups)[:4] == [1.0, 0.0, 0.0, 0.0]  # the input is left as it was
