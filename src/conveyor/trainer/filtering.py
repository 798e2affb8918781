"""Which finished rollouts enter the learning signal, by status; every exclusion is counted.

Per status (see `conveyor.types.Status`):

- `ok`, `policy_error`, `timeout`: scored by the task (the last two usually with reward 0) and
  trained on. Failing is the policy's own outcome and it should learn from it.
- `truncated`: `StatusPolicy.truncated` says `score` (default: trained like `ok`) or `mask`
  (DAPO-style overlong masking: the trajectory keeps its place in the group baseline and the
  reward statistics, but none of its tokens is trained on).
- `infra_error`: never scored, never trained, never in a baseline. The dispatcher resamples it;
  one still present after its retries marks its group as incomplete. An incomplete group is
  trained on what it has (`train_partial`, default, when at least `min_partial_size` scored
  trajectories remain; counted in `partial_groups`) or dropped (`drop`). The loop may refill
  missing samples first (`rl.groups.incomplete: refill`, see `conveyor.trainer.refill`); this
  module then applies the fallback rule to what is still short.

Groups of at least two trajectories whose rewards are all equal carry no group-relative signal;
they are counted and, with `filter_zero_variance_groups`, dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from conveyor.types import Status, TrajectoryGroup


class StatusPolicy(BaseModel):
    """How trajectory statuses and incomplete or uninformative groups are treated in training."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    truncated: Literal["score", "mask"] = Field(
        default="score",
        description="'score': a truncated trajectory is trained on with the reward the task "
        "gave it; 'mask': it stays in the group baseline and the statistics but gets no loss.",
    )
    incomplete_group: Literal["train_partial", "drop"] = Field(
        default="train_partial",
        description="A group that still has infra_error trajectories after their retries: "
        "'train_partial' trains on the scored ones (if at least min_partial_size remain), "
        "'drop' drops the whole group.",
    )
    min_partial_size: int = Field(
        default=2,
        ge=1,
        description="Fewest scored trajectories an incomplete group needs to be trained on.",
    )
    filter_zero_variance_groups: bool = Field(
        default=False,
        description="Drop groups whose rewards are all equal (they are always counted).",
    )


@dataclass(frozen=True)
class Selection:
    """The groups that train, and a count of everything that was left out or masked.

    `groups` hold only scored trajectories (infra errors removed); `trainable[g][i]` is False for
    a trajectory that counts in the baseline but gets no loss (a masked truncated one).
    """

    groups: list[TrajectoryGroup] = field(default_factory=list)
    trainable: list[list[bool]] = field(default_factory=list)
    dropped_groups: int = 0  # groups left out for any reason below
    incomplete_groups: int = 0  # groups with infra_error trajectories left, kept or dropped
    partial_groups: int = 0  # of those, kept and trained on what they have
    zero_variance_groups: int = 0  # kept-eligible groups whose rewards are all equal
    dropped_trajectories: int = 0  # scored trajectories inside dropped groups
    masked_truncated: int = 0  # truncated trajectories kept for the baseline but not trained
    infra_excluded: int = 0  # infra_error trajectories, never scored or trained

    def metrics(self) -> dict[str, int]:
        """The counters as a flat dict for `metrics.jsonl`."""
        return {
            "filter/kept_groups": len(self.groups),
            "filter/dropped_groups": self.dropped_groups,
            "filter/incomplete_groups": self.incomplete_groups,
            "filter/partial_groups": self.partial_groups,
            "filter/zero_variance_groups": self.zero_variance_groups,
            "filter/dropped_trajectories": self.dropped_trajectories,
            "filter/masked_truncated": self.masked_truncated,
            "filter/infra_excluded": self.infra_excluded,
        }


def select(groups: Sequence[TrajectoryGroup], policy: StatusPolicy) -> Selection:
    """Apply `policy` to `groups`: drop, mask and count as the module docstring describes.

    A scored trajectory without a reward is an error: it would otherwise enter the baseline as
    a fake value.
    """
    kept: list[TrajectoryGroup] = []
    trainable: list[list[bool]] = []
    dropped = incomplete = partial = zero_variance = dropped_trajectories = masked = infra = 0
    for group in groups:
        scored = [t for t in group.trajectories if t.status != Status.INFRA_ERROR]
        missing = len(group.trajectories) - len(scored)
        infra += missing
        for trajectory in scored:
            if trajectory.reward is None:
                raise ValueError(
                    f"trajectory {trajectory.task_id}/{trajectory.sample_index} has status "
                    f"{trajectory.status} but no reward; only infra_error may lack one"
                )
        if missing:
            incomplete += 1
            if policy.incomplete_group == "drop" or len(scored) < policy.min_partial_size:
                dropped += 1
                dropped_trajectories += len(scored)
                continue
            partial += 1
        if not scored:  # an empty group: nothing to drop but the group itself
            dropped += 1
            continue
        rewards = [t.reward for t in scored]
        if len(scored) >= 2 and all(r == rewards[0] for r in rewards):
            zero_variance += 1
            if policy.filter_zero_variance_groups:
                dropped += 1
                dropped_trajectories += len(scored)
                continue
        flags = [not (policy.truncated == "mask" and t.status == Status.TRUNCATED) for t in scored]
        masked += flags.count(False)
        kept.append(group.model_copy(update={"trajectories": scored}))
        trainable.append(flags)
    return Selection(
        groups=kept,
        trainable=trainable,
        dropped_groups=dropped,
        incomplete_groups=incomplete,
        partial_groups=partial,
        zero_variance_groups=zero_variance,
        dropped_trajectories=dropped_trajectories,
        masked_truncated=masked,
        infra_excluded=infra,
    )
