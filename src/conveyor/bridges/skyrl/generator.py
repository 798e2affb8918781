"""SkyRL's generator seam: `ConveyorGenerator.generate(GeneratorInput) -> GeneratorOutput`.

SkyRL-train asks its generator for one batch of rollouts and trains on what comes back. This
generator runs the batch through our dispatcher (init, run, reward per rollout) and converts the
trajectories to SkyRL's `GeneratorOutput` dict with `to_generator_output`. Nothing here imports
SkyRL: the dicts are plain, so the same code runs in the main venv (Python 3.11) and, subclassing
SkyRL's real `GeneratorInterface` (`skyrl_generator_class`), inside `.venv-skyrl`.

Which SkyRL rows a trajectory becomes:
- default: one row per rollout, as SkyRL requires one response per prompt. A trajectory split
  into several training samples (its chat template broke the prefix property) gives its first
  sample only; the others are dropped and counted (`conveyor/dropped_samples`).
- step-wise (`step_wise=True`, SkyRL's `generator.step_wise_trajectories`): one row per training
  sample, rows of one rollout adjacent, `is_last_step` True on its last one. The reward sits on
  the last row and 0.0 on the others: SkyRL computes the advantage on the last step and
  broadcasts it to the earlier ones.
- a rollout recorded as `infra_error` has no reward to learn from: its row keeps the shape SkyRL
  requires, with an all-zero loss mask (SkyRL counts such rows as not live) and reward 0.0, and
  is counted (`conveyor/infra_errors`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.bridges.skyrl.sampling import to_sampling
from conveyor.bridges.skyrl.validation import TrajectoryRef
from conveyor.types import Status, Task, Trajectory

if TYPE_CHECKING:
    from conveyor.app.compose import Composition
    from conveyor.config import SamplingConfig
    from conveyor.dispatch.base import Dispatcher

# The keys of `GeneratorOutput` this bridge writes (the rest are optional side channels for
# mixture-of-experts routing, vision inputs and timing that our rollouts do not produce).
WRITTEN_KEYS = (
    "prompt_token_ids",
    "response_ids",
    "rewards",
    "loss_masks",
    "stop_reasons",
    "rollout_metrics",
    "rollout_logprobs",
    "trajectory_ids",
    "is_last_step",
)
# The `env_classes` entry for a conveyor task (its family's name is accepted too).
ENV_CLASS = "conveyor"


def to_generator_output(
    trajectories: Sequence[Trajectory],
    step_wise: bool,
    trajectory_ids: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """SkyRL's `GeneratorOutput` for `trajectories` (one rollout each, in batch order).

    `trajectory_ids[i]` is echoed for trajectory i (SkyRL's own `TrajectoryID` objects); by
    default a `TrajectoryRef(task_id, sample_index)`.
    """
    if trajectory_ids is not None and len(trajectory_ids) != len(trajectories):
        raise ValueError(f"{len(trajectory_ids)} trajectory ids for {len(trajectories)} rollouts")
    out: dict[str, list[Any]] = {
        key: [] for key in WRITTEN_KEYS if key != "rollout_metrics" and key != "is_last_step"
    }
    is_last_step: list[bool] = []
    dropped = infra = 0
    for i, trajectory in enumerate(trajectories):
        ref = (
            trajectory_ids[i]
            if trajectory_ids is not None
            else TrajectoryRef(trajectory.task_id, trajectory.sample_index)
        )
        samples = trajectory.samples()
        stops = _sample_stop_reasons(trajectory)
        reward = 0.0 if trajectory.reward is None else float(trajectory.reward)
        broken = trajectory.status is Status.INFRA_ERROR
        infra += broken
        if not samples:
            samples_rows: list[tuple[list[int], list[int], list[int], list[float], str]] = [
                ([], [], [], [], str(trajectory.stop_reason) or str(trajectory.status))
            ]
        else:
            samples_rows = [
                (
                    s.input_ids[: s.prompt_length],
                    s.input_ids[s.prompt_length :],
                    s.loss_mask[s.prompt_length :],
                    s.logprobs[s.prompt_length :],
                    stops[k],
                )
                for k, s in enumerate(samples)
            ]
        if not step_wise:
            dropped += len(samples_rows) - 1
            samples_rows = samples_rows[:1]
        for k, (prompt, response, mask, logprobs, stop) in enumerate(samples_rows):
            last = k == len(samples_rows) - 1
            out["prompt_token_ids"].append(list(prompt))
            out["response_ids"].append(list(response))
            out["loss_masks"].append([0] * len(mask) if broken else list(mask))
            out["rollout_logprobs"].append(list(logprobs))
            out["rewards"].append(reward if last and not broken else 0.0)
            out["stop_reasons"].append(stop)
            out["trajectory_ids"].append(ref)
            is_last_step.append(last)
    result: dict[str, Any] = dict(out)
    result["rollout_metrics"] = {
        "conveyor/rollouts": len(trajectories),
        "conveyor/dropped_samples": dropped,
        "conveyor/infra_errors": infra,
    }
    result["is_last_step"] = is_last_step if step_wise else None
    return result


def _sample_stop_reasons(trajectory: Trajectory) -> dict[int, str]:
    """Per training sample (in `samples()` order), the stop reason of its last turn."""
    last: dict[int, str] = {}
    for turn in trajectory.turns:
        last[turn.sample_index] = str(turn.stop_reason)
    return {k: last[index] for k, index in enumerate(sorted(last))}


class ConveyorGenerator:
    """SkyRL's generator, running each batch through our dispatcher.

    Each input row carries one of our tasks in `env_extras[i]["task"]` (a `Task` as a dict or
    JSON string; `env_classes[i]` is `conveyor` or the task's family). Rows of one task are its
    samples: `trajectory_ids[i].repetition_id` is the sample index (else rows are numbered in
    order). Build one with `from_composition` (SkyRL's `sampling_params` then become ours) or
    `from_dispatcher` (fixed stages; `sampling_params` must be empty). With `trajectories_path`,
    every rollout's `Trajectory` is appended there as JSONL (what SkyRL's rows cannot hold:
    messages, statuses, timings, for `conveyor view` and `conveyor bridge check`).
    """

    def __init__(
        self,
        make_dispatcher: Callable[[SamplingConfig | None], Dispatcher],
        *,
        step_wise: bool = False,
        base_sampling: SamplingConfig | None = None,
        trajectories_path: Path | None = None,
        max_completion_tokens: int | None = None,
    ) -> None:
        self._make_dispatcher = make_dispatcher
        self._max_completion_tokens = max_completion_tokens
        self.step_wise = step_wise
        self._base_sampling = base_sampling
        self.trajectories_path = trajectories_path

    @classmethod
    def from_composition(
        cls,
        parts: Composition,
        *,
        step_wise: bool = False,
        trajectories_path: Path | None = None,
    ) -> ConveyorGenerator:
        """Stages and dispatcher built by `parts` for each batch's sampling parameters."""

        def make(sampling: SamplingConfig | None) -> Dispatcher:
            return parts.dispatcher(parts.stages(sampling), engine=parts.engine)

        return cls(
            make,
            step_wise=step_wise,
            base_sampling=parts.config.sampling,
            trajectories_path=trajectories_path,
            max_completion_tokens=parts.config.agent.max_completion_tokens,
        )

    @classmethod
    def from_dispatcher(
        cls,
        dispatcher: Dispatcher,
        *,
        step_wise: bool = False,
        trajectories_path: Path | None = None,
    ) -> ConveyorGenerator:
        """A dispatcher whose stages fix the sampling; batches whose sampling parameters would
        change it are refused, since they could not be honoured."""

        def make(sampling: SamplingConfig | None) -> Dispatcher:
            return dispatcher

        return cls(make, step_wise=step_wise, trajectories_path=trajectories_path)

    def sampling(self, params: dict[str, Any] | None) -> SamplingConfig | None:
        """Our sampling settings for SkyRL's `sampling_params` (`sampling.to_sampling`)."""
        return to_sampling(params, self._base_sampling, self._max_completion_tokens)

    async def generate(self, input_batch: dict[str, Any]) -> dict[str, Any]:
        """Run the batch's rollouts; SkyRL's `GeneratorOutput`, rows in input order."""
        tasks, indices = read_batch(input_batch)
        dispatcher = self._make_dispatcher(self.sampling(input_batch.get("sampling_params")))
        by_key: dict[tuple[str, int], Trajectory] = {}
        # One dispatcher call per distinct sample count; SkyRL's batches have one.
        counts: dict[str, int] = {}
        first: dict[str, Task] = {}
        for task, index in zip(tasks, indices, strict=True):
            first.setdefault(task.id, task)
            counts[task.id] = max(counts.get(task.id, 0), index + 1)
        groups: dict[int, list[Task]] = {}
        for task_id, task in first.items():
            groups.setdefault(counts[task_id], []).append(task)
        for count, group in groups.items():
            async for trajectory in dispatcher.rollouts(group, count):
                by_key[(trajectory.task_id, trajectory.sample_index)] = trajectory
                if self.trajectories_path is not None:
                    with self.trajectories_path.open("a") as out:
                        out.write(trajectory.to_json() + "\n")
        ordered = [by_key[(task.id, index)] for task, index in zip(tasks, indices, strict=True)]
        extra = sum(len(group) * count for count, group in groups.items()) - len(ordered)
        output = to_generator_output(ordered, self.step_wise, input_batch.get("trajectory_ids"))
        output["rollout_metrics"]["conveyor/unrequested_rollouts"] = extra
        return output


def read_batch(input_batch: dict[str, Any]) -> tuple[list[Task], list[int]]:
    """The task and sample index of every row of SkyRL's `GeneratorInput`; ValueError naming
    the row when one cannot be run."""
    prompts = input_batch.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise ValueError("GeneratorInput.prompts must be a non-empty list")
    n = len(prompts)
    extras = input_batch.get("env_extras")
    classes = input_batch.get("env_classes")
    ids = input_batch.get("trajectory_ids")
    for name, value in (("env_extras", extras), ("env_classes", classes), ("trajectory_ids", ids)):
        if value is not None and len(value) != n:
            raise ValueError(f"GeneratorInput.{name} has {len(value)} rows for {n} prompts")
    if extras is None:
        raise ValueError('GeneratorInput.env_extras must carry each row\'s task ({"task": ...})')
    tasks: list[Task] = []
    indices: list[int] = []
    counts: dict[str, int] = {}
    for i in range(n):
        raw = (extras[i] or {}).get("task")
        if raw is None:
            raise ValueError(f'row {i}: env_extras has no "task" (a conveyor Task as JSON)')
        task = Task.model_validate_json(raw) if isinstance(raw, str) else Task.model_validate(raw)
        if classes is not None and classes[i] not in (ENV_CLASS, task.family):
            raise ValueError(
                f"row {i}: env_class {classes[i]!r} is neither {ENV_CLASS!r} nor the task's "
                f"family {task.family!r}"
            )
        if _contents(prompts[i]) != _contents(task.prompt):
            raise ValueError(f"row {i}: the prompt differs from task {task.id}'s own prompt")
        if ids is not None:
            index = int(ids[i].repetition_id)
        else:
            index = counts.get(task.id, 0)
            counts[task.id] = index + 1
        tasks.append(task)
        indices.append(index)
    pairs = list(zip((t.id for t in tasks), indices, strict=True))
    if len(set(pairs)) != len(pairs):
        raise ValueError("two rows name the same task and repetition id")
    return tasks, indices


def _contents(conversation: Any) -> list[tuple[Any, Any]]:
    return [(m.get("role"), m.get("content")) for m in conversation]


def skyrl_generator_class() -> type[ConveyorGenerator]:
    """`ConveyorGenerator` as a subclass of SkyRL's real `GeneratorInterface` (inside
    `.venv-skyrl`, where SkyRL imports); ImportError elsewhere."""
    from skyrl.train.generators.base import GeneratorInterface  # type: ignore[import-not-found]

    return type("SkyrlConveyorGenerator", (ConveyorGenerator, GeneratorInterface), {})
