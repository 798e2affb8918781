"""The status policy: what trains, what is masked, what is dropped, and that each is counted."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from conveyor.trainer.filtering import Selection, StatusPolicy, select
from conveyor.types import Status, Trajectory, TrajectoryGroup


def group(task_id: str, *members: tuple[Status, float | None]) -> TrajectoryGroup:
    return TrajectoryGroup(
        task_id=task_id,
        trajectories=[
            Trajectory(task_id=task_id, sample_index=i, status=status, reward=reward)
            for i, (status, reward) in enumerate(members)
        ],
    )


OK, TRUNC, PERR, TIME, INFRA = (
    Status.OK,
    Status.TRUNCATED,
    Status.POLICY_ERROR,
    Status.TIMEOUT,
    Status.INFRA_ERROR,
)


def batch() -> list[TrajectoryGroup]:
    return [
        group("a", (OK, 1.0), (PERR, 0.0), (TIME, 0.0), (TRUNC, 0.0)),  # complete, informative
        group("b", (OK, 1.0), (INFRA, None), (OK, 0.0)),  # incomplete, 2 scored remain
        group("c", (INFRA, None), (INFRA, None), (OK, 1.0)),  # incomplete, 1 scored remains
        group("d", (OK, 0.0), (PERR, 0.0), (OK, 0.0)),  # all equal
    ]


def test_defaults() -> None:
    policy = StatusPolicy()
    assert policy.truncated == "score"
    assert policy.incomplete_group == "train_partial"
    assert policy.min_partial_size == 2
    assert policy.filter_zero_variance_groups is False
    with pytest.raises(ValidationError):
        StatusPolicy(truncated="drop")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        StatusPolicy(filter_zero_variance=True)  # type: ignore[call-arg]


def test_default_policy_counts() -> None:
    selection = select(batch(), StatusPolicy())
    assert [g.task_id for g in selection.groups] == ["a", "b", "d"]
    # policy_error, timeout and truncated are scored and trained; infra errors removed
    assert [len(g.trajectories) for g in selection.groups] == [4, 2, 3]
    assert all(t.status != INFRA for g in selection.groups for t in g.trajectories)
    assert selection.trainable == [[True] * 4, [True] * 2, [True] * 3]
    assert selection.dropped_groups == 1  # c: one scored trajectory is below min_partial_size
    assert selection.dropped_trajectories == 1
    assert selection.incomplete_groups == 2
    assert selection.partial_groups == 1  # b trains on its two scored ones, c is dropped
    assert selection.infra_excluded == 3
    assert selection.zero_variance_groups == 1  # d counted, not dropped
    assert selection.masked_truncated == 0
    assert selection.metrics()["filter/kept_groups"] == 3


def test_mask_truncated_drop_incomplete_and_filter_zero_variance() -> None:
    policy = StatusPolicy(
        truncated="mask", incomplete_group="drop", filter_zero_variance_groups=True
    )
    selection = select(batch(), policy)
    assert [g.task_id for g in selection.groups] == ["a"]
    # the truncated trajectory stays in the group (baseline, statistics) but gets no loss
    assert [t.status for t in selection.groups[0].trajectories] == [OK, PERR, TIME, TRUNC]
    assert selection.trainable == [[True, True, True, False]]
    assert selection.masked_truncated == 1
    assert selection.dropped_groups == 3  # b and c incomplete, d zero variance
    assert selection.dropped_trajectories == 2 + 1 + 3
    assert selection.incomplete_groups == 2
    assert selection.partial_groups == 0
    assert selection.zero_variance_groups == 1
    assert selection.infra_excluded == 3


def test_every_trajectory_is_accounted_for() -> None:
    for policy in (StatusPolicy(), StatusPolicy(incomplete_group="drop", min_partial_size=1)):
        groups = batch()
        selection = select(groups, policy)
        total = sum(len(g.trajectories) for g in groups)
        kept = sum(len(g.trajectories) for g in selection.groups)
        assert kept + selection.dropped_trajectories + selection.infra_excluded == total
        assert len(selection.groups) + selection.dropped_groups == len(groups)


def test_partial_group_of_one_kept_when_allowed() -> None:
    selection = select(batch(), StatusPolicy(min_partial_size=1))
    assert [g.task_id for g in selection.groups] == ["a", "b", "c", "d"]
    assert selection.dropped_groups == 0
    assert selection.partial_groups == 2


def test_single_trajectory_group_is_not_zero_variance() -> None:
    selection = select([group("n1", (OK, 1.0))], StatusPolicy(filter_zero_variance_groups=True))
    assert len(selection.groups) == 1 and selection.zero_variance_groups == 0


def test_scored_status_without_reward_is_an_error() -> None:
    with pytest.raises(ValueError, match="no reward"):
        select([group("x", (OK, 1.0), (TIME, None))], StatusPolicy())


def test_empty_selection() -> None:
    assert select([], StatusPolicy()) == Selection()
