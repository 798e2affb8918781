"""Advantage estimators: one advantage per trajectory, from the rewards of its group or batch.

An estimator maps the rewards of a batch, given group by group, to advantages of the same shape.
The baseline counts trajectories, never training samples: a trajectory split into several samples
(see `Trajectory.samples`) is one reward and one advantage, which `assign_to_samples` then gives to
each of its samples. Standard deviations are population ones (ddof=0) and `eps` keeps the
division finite when every reward is equal; such a group or batch gets advantage 0, not NaN.

Config names an estimator with its options (`rl.advantage: {name: grpo, options: {scale_by_std:
false}}`); each registers an `AdvantageSpec` whose options model checks them, and
`get_advantage(name, **options)` builds it. The math is in `docs/algorithms.md`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from conveyor.registry import ADVANTAGES, NoOptions
from conveyor.types import TrainingSample, TrajectoryGroup

GroupRewards = Sequence[Sequence[float]]
GroupAdvantages = list[list[float]]


class AdvantageEstimator(Protocol):
    """Turns the rewards of a batch, group by group, into one advantage per trajectory."""

    name: ClassVar[str]

    def __call__(self, rewards: GroupRewards) -> GroupAdvantages:
        """Advantages nested like `rewards`: `out[g][i]` is for trajectory i of group g."""
        ...


E = TypeVar("E", bound=type[AdvantageEstimator])


def register_advantage(name: str, options: type[BaseModel] = NoOptions) -> Callable[[E], E]:
    """Class decorator: make an estimator selectable by `name` in config (`ADVANTAGES`), built
    with the fields of `options` (its `rl.advantage.options`) as keyword arguments."""
    return ADVANTAGES.register(name, options=options)


def get_advantage(name: str, **options: Any) -> AdvantageEstimator:
    """The estimator registered as `name`, built with `options` checked by its options model
    (a `ValueError` names an unknown or bad one)."""
    return build_advantage(name, options)


def build_advantage(name: str, options: BaseModel | dict[str, Any]) -> AdvantageEstimator:
    """The estimator `name` with `options` (`rl.advantage.options`, or a plain mapping)."""
    spec = ADVANTAGES.spec(name)
    checked = spec.validate_options(options, "rl.advantage.options")
    estimator: AdvantageEstimator = spec.build(**dict(checked))
    return estimator


class GRPOOptions(BaseModel):
    """`rl.advantage.options` of `grpo`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    scale_by_std: bool = Field(default=True, description="Divide by the group's std.")
    eps: float = Field(default=1e-6, ge=0, description="Added to the std before dividing.")


class ReinforcePPOptions(BaseModel):
    """`rl.advantage.options` of `reinforce_pp`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    eps: float = Field(default=1e-6, ge=0, description="Added to the std before dividing.")


@register_advantage("grpo", GRPOOptions)
@dataclass(frozen=True)
class GRPO:
    """Group-normalised advantage: `(r - mean(group)) / (std(group) + eps)`.

    With `scale_by_std=False` it is `r - mean(group)` (the Dr. GRPO choice, which does not
    up-weight groups that are nearly solved or nearly failed). A group of one trajectory gets 0.
    """

    name: ClassVar[str]
    scale_by_std: bool = True
    eps: float = 1e-6

    def __call__(self, rewards: GroupRewards) -> GroupAdvantages:
        """Advantages group by group; see the class docstring."""
        out: GroupAdvantages = []
        for group in rewards:
            r = np.asarray(group, dtype=np.float64)
            if r.size == 0:
                out.append([])
                continue
            centred = r - r.mean()
            if self.scale_by_std:
                centred = centred / (r.std() + self.eps)
            out.append([float(a) for a in centred])
        return out


@register_advantage("rloo")
@dataclass(frozen=True)
class RLOO:
    """Leave-one-out baseline: `r_i - mean(r_j for j != i)` within the group.

    Equal to `n / (n - 1) * (r_i - mean(group))`; unbiased because the baseline of a trajectory
    does not depend on its own reward. A group of one trajectory has no baseline and gets 0.
    """

    name: ClassVar[str]

    def __call__(self, rewards: GroupRewards) -> GroupAdvantages:
        """Advantages group by group; see the class docstring."""
        out: GroupAdvantages = []
        for group in rewards:
            r = np.asarray(group, dtype=np.float64)
            if r.size < 2:
                out.append([0.0] * r.size)
                continue
            others_mean = (r.sum() - r) / (r.size - 1)
            out.append([float(a) for a in r - others_mean])
        return out


@register_advantage("reinforce_pp", ReinforcePPOptions)
@dataclass(frozen=True)
class ReinforcePP:
    """REINFORCE++-style global baseline: `(r - mean(batch)) / (std(batch) + eps)`.

    Groups play no part: the mean and std run over every trajectory of the batch, so it also
    works with one rollout per task.
    """

    name: ClassVar[str]
    eps: float = 1e-6

    def __call__(self, rewards: GroupRewards) -> GroupAdvantages:
        """Advantages in the nesting of `rewards`; see the class docstring."""
        flat = np.asarray([reward for group in rewards for reward in group], dtype=np.float64)
        if flat.size == 0:
            return [[] for _ in rewards]
        normalised = (flat - flat.mean()) / (flat.std() + self.eps)
        out: GroupAdvantages = []
        start = 0
        for group in rewards:
            out.append([float(a) for a in normalised[start : start + len(group)]])
            start += len(group)
        return out


class FixedBaselineOptions(BaseModel):
    """`rl.advantage.options` of `fixed_baseline`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    baseline: float = Field(default=0.0, description="Subtracted from every reward.")


@register_advantage("fixed_baseline", FixedBaselineOptions)
@dataclass(frozen=True)
class FixedBaseline:
    """Plain REINFORCE with a constant baseline: `r - baseline` for every trajectory.

    No group or batch statistics: a step whose rewards are all equal still gets a nonzero update
    when they differ from the baseline. configs/scale-twin.yaml uses it so that a random model,
    which earns 0 everywhere, still trains (every sampled token pushed down by the same amount).
    """

    name: ClassVar[str]
    baseline: float = 0.0

    def __call__(self, rewards: GroupRewards) -> GroupAdvantages:
        """Advantages in the nesting of `rewards`; see the class docstring."""
        return [[float(r) - self.baseline for r in group] for group in rewards]


def group_rewards(groups: Sequence[TrajectoryGroup]) -> list[list[float]]:
    """The rewards of every trajectory, group by group; a missing reward is an error, never 0."""
    out: list[list[float]] = []
    for group in groups:
        rewards: list[float] = []
        for trajectory in group.trajectories:
            if trajectory.reward is None:
                raise ValueError(
                    f"trajectory {trajectory.task_id}/{trajectory.sample_index} "
                    f"(status {trajectory.status}) has no reward; filter groups with "
                    "conveyor.trainer.filtering.select before computing advantages"
                )
            rewards.append(trajectory.reward)
        out.append(rewards)
    return out


def assign_to_samples(
    groups: Sequence[TrajectoryGroup],
    advantages: Sequence[Sequence[float]],
    trainable: Sequence[Sequence[bool]] | None = None,
) -> list[tuple[TrainingSample, float]]:
    """Give every training sample of a trajectory that trajectory's advantage.

    `advantages[g][i]` belongs to `groups[g].trajectories[i]`. Trajectories whose `trainable` flag
    is False (see `Selection.trainable`) count in the baseline but yield no sample.
    """
    if len(advantages) != len(groups):
        raise ValueError(f"{len(advantages)} advantage groups for {len(groups)} trajectory groups")
    out: list[tuple[TrainingSample, float]] = []
    for g, (group, group_advantages) in enumerate(zip(groups, advantages, strict=True)):
        flags = [True] * len(group.trajectories) if trainable is None else trainable[g]
        if not len(group.trajectories) == len(group_advantages) == len(flags):
            raise ValueError(
                f"group {group.task_id}: {len(group.trajectories)} trajectories, "
                f"{len(group_advantages)} advantages, {len(flags)} trainable flags"
            )
        for trajectory, advantage, flag in zip(
            group.trajectories, group_advantages, flags, strict=True
        ):
            if flag:
                out.extend((sample, advantage) for sample in trajectory.samples())
    return out


def shuffled_rewards(
    groups: Sequence[TrajectoryGroup], seed: int, step: int
) -> list[TrajectoryGroup]:
    """The random-reward control: `groups` with the rewards of their scored trajectories
    permuted among all of them (one permutation per `(seed, step)`), everything else as it
    was. The count of each reward value is kept, so the batch's mean reward is too; which
    rollout earned it is not. Trajectories without a reward keep none."""
    scored = [
        (g, t)
        for g, group in enumerate(groups)
        for t, x in enumerate(group.trajectories)
        if x.reward is not None
    ]
    rewards = [groups[g].trajectories[t].reward for g, t in scored]
    random.Random(f"shuffled-rewards/{seed}/{step}").shuffle(rewards)
    new = {place: reward for place, reward in zip(scored, rewards, strict=True)}
    return [
        group.model_copy(
            update={
                "trajectories": [
                    x.model_copy(update={"reward": new[(g, t)]}) if (g, t) in new else x
                    for t, x in enumerate(group.trajectories)
                ]
            }
        )
        for g, group in enumerate(groups)
    ]
