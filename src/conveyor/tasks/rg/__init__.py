"""Reasoning Gym: procedurally generated reasoning puzzles from `reasoning-gym`, answered with
`finish(answer)` and graded by each dataset's own `score_answer`.

Options (`tasks.options.rg`, checked by `RgOptions`):
- `datasets`: the reasoning-gym datasets to draw from (default `DEFAULT_DATASETS`: cheap,
  deterministic ones with strict scorers and short answers). Unknown names are refused with close
  names; datasets the family cannot use safely are refused with the reason (`scoring.REFUSED`).
- `python`: add the sandboxed `python(code)` tool (`conveyor.tasks.executor`); the rollout's
  runtime is then an executor sandbox (bubblewrap by default) in which the reasoning-gym package
  is hidden, so code cannot regenerate the dataset and look the question up. Without it the
  runtime is the simulated one with no files.
- `config`: per-dataset config fields, e.g. `{chain_sum: {min_terms: 4, max_terms: 6}}` (the
  fields of the dataset's reasoning-gym config class, except `seed` and `size`; checked by
  building the dataset).
- `partial_credit`: use the scorer's value as the reward (default off: the reward is 1.0 when the
  scorer gives 1.0, else 0.0, because most scorers give small credit to any text, see
  `scoring`).

Instances: position `p` of a split draws from dataset `p mod k` (k datasets, in the listed
order), each dataset's instances coming from `sample_instances` with its own RNG, so the list is
balanced across datasets, the same for the same arguments, and a larger `n` extends a smaller
one. An instance is entry `i` of dataset `d` built with `DATASET_SEED`; its split is a hash of
(d, question), so no seed moves it between splits. Draws whose stored answer does not score 1.0
under the dataset's own scorer are skipped, so every instance has an oracle.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import json
import random
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from conveyor.agent.loop import final_answer
from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import ToolRegistry, finish
from conveyor.config import RuntimeConfig
from conveyor.registry import RUNTIMES
from conveyor.runtime.base import Runtime
from conveyor.runtime.selection import RuntimeRequest, start_runtime
from conveyor.tasks.executor import EXECUTOR_RUNTIMES, python, start_executor_runtime
from conveyor.tasks.family import (
    SPLIT_SHARES,
    FamilyServices,
    Grade,
    family_options,
    instance_task,
    opening,
    register_family,
    runtime_choice,
    sample_instances,
)
from conveyor.tasks.rg import scoring as rg_scoring
from conveyor.types import Task, ToolCall, Trajectory

DEFAULT_DATASETS: tuple[str, ...] = (
    "chain_sum",
    "gcd",
    "calendar_arithmetic",
    "family_relationships",
    "shortest_path",
    "number_format",
)
# Draws of one dataset in a row whose stored answer fails its own scorer before giving up.
_ORACLE_TRIES = 20
# Seconds a scorer may take before the answer counts as wrong (its thread is left to finish).
SCORE_TIMEOUT_S = 30.0
# The oracle runs its answer through `python` first when the answer is at most this long.
_ORACLE_TRY_CHARS = 200


def _version() -> str:
    try:
        return importlib.metadata.version("reasoning-gym")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


class RgOptions(BaseModel):
    """`tasks.options.rg`: which datasets, whether the `python` tool is on, how rewards count."""

    model_config = ConfigDict(extra="forbid")

    datasets: list[str] = Field(default_factory=lambda: list(DEFAULT_DATASETS), min_length=1)
    python: bool = False
    config: dict[str, dict[str, Any]] = Field(default_factory=dict)
    partial_credit: bool = False

    @field_validator("datasets")
    @classmethod
    def _usable(cls, names: list[str]) -> list[str]:
        return rg_scoring.check_dataset_names(names)

    @model_validator(mode="after")
    def _configs_of_listed_datasets(self) -> Self:
        stray = sorted(set(self.config) - set(self.datasets))
        if stray:
            raise ValueError(f"config names datasets not in datasets: {', '.join(stray)}")
        for name, values in self.config.items():
            rg_scoring.check_dataset_config(name, values)
        return self


def _system_prompt(with_python: bool) -> str:
    done = format_tool_call(ToolCall(name="finish", arguments={"answer": "42"}), "hermes")
    tools = ""
    if with_python:
        example = ToolCall(name="python", arguments={"code": "print(6 * 7)"})
        run = format_tool_call(example, "hermes")
        tools = (
            "You can run Python code in a sandbox with the python tool; it returns what the code "
            f"printed. Make one call per message and wait for the result, like this:\n{run}\n"
        )
    return (
        "You solve reasoning puzzles. Think step by step, then submit only the final answer, "
        f"in exactly the format the question asks for. {tools}"
        f"Submit the answer with the finish tool, exactly like this:\n{done}"
    )


@register_family(options=RgOptions)
class RgFamily:
    """Reasoning-gym puzzles; tools `finish` (and `python` with the `python` option).

    `Task.data` holds `dataset` (its name), `config` (the dataset's config fields set by the
    `config` option), `index` (the entry's index) and `entry` (the
    reasoning-gym entry as JSON: question, answer, metadata), which the dataset's own
    `score_answer` grades against.
    """

    name = "rg"
    splits = tuple(SPLIT_SHARES)  # 80/10/10 by a hash of (dataset, question)
    source = "reasoning-gym (PyPI), procedurally generated"
    version = _version()

    def __init__(
        self, runtime: RuntimeConfig | None = None, services: FamilyServices | None = None
    ) -> None:
        services = services or FamilyServices()
        self.options = family_options(self.name, RgOptions, services.options)
        self.runtimes = EXECUTOR_RUNTIMES if self.options.python else ("simulated",)
        self.runtime, self.runtime_kind = runtime_choice(self.name, runtime, self.runtimes)
        self.system_prompt = _system_prompt(self.options.python)

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct puzzles of `split`, round-robin over the datasets, deterministic in
        (n, seed, split)."""
        names = self.options.datasets
        counts = [len(range(i, n, len(names))) for i in range(len(names))]
        configs = self.options.config
        drawn = [
            sample_instances(
                f"{self.name}/{name}", count, seed, split, _drawer(name, configs.get(name, {}))
            )
            for name, count in zip(names, counts, strict=True)
        ]
        instances = [drawn[p % len(names)][p // len(names)] for p in range(n)]
        return [self._task(split, p, data) for p, data in enumerate(instances)]

    def benchmark_tasks(
        self, datasets: list[tuple[str, dict[str, Any]]], seed: int, size: int
    ) -> list[Task]:
        """Every entry of each `(name, config)` dataset built as reasoning-gym's own eval builds
        it (`create_dataset(name, seed=seed, size=size, **config)`), in order, oracle or not;
        split "test". The datasets are checked like the `datasets` option."""
        rg_scoring.check_dataset_names([name for name, _ in datasets])
        tasks: list[Task] = []
        for name, config in datasets:
            rg_scoring.check_dataset_config(name, config)
            built = rg_scoring.dataset(name, config, seed=seed, size=size)
            for index in range(size):
                entry = rg_scoring.json_entry(built[index])
                data = {
                    "dataset": name,
                    "config": config,
                    "index": index,
                    "seed": seed,
                    "size": size,
                    "entry": entry,
                }
                prompt = opening(self.system_prompt, entry["question"])
                tasks.append(
                    instance_task(self.name, "test", len(tasks), prompt, data, f"{name}-{index}")
                )
        return tasks

    def _task(self, split: str, index: int, data: dict[str, Any]) -> Task:
        return instance_task(
            self.name,
            split,
            index,
            opening(self.system_prompt, data["entry"]["question"]),
            data,
        )

    def tools(self) -> ToolRegistry:
        """`finish`, with `python` first when the option is on."""
        return ToolRegistry([python, finish] if self.options.python else [finish])

    async def make_runtime(self, task: Task) -> Runtime:
        """An executor sandbox (reasoning-gym hidden where the kind allows) with `python`; an
        empty simulated runtime without."""
        if not self.options.python:
            return await start_runtime(self.runtime_kind, RuntimeRequest(files={}), self.runtime)
        hidden = [_package_dir()] if RUNTIMES.spec(self.runtime_kind).hides_paths else []
        return await start_executor_runtime(self.runtime, hidden=hidden)

    async def grade(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Grade:
        """The reward, with the scorer's own value (`scorer`) in the breakdown."""
        raw = await self._raw(task, final_answer(trajectory))
        return Grade(reward=self._reward(raw), breakdown={"scorer": raw})

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """1.0 if the dataset's scorer gives `answer` (as given, None for no answer) 1.0 (its
        value with `partial_credit`); 0.0 for an over-long answer, one an eval-based scorer must
        not see, or one the scorer takes over `SCORE_TIMEOUT_S` on."""
        return self._reward(await self._raw(task, answer))

    async def _raw(self, task: Task, answer: str | None) -> float:
        data = task.data
        # Scorers are synchronous and some are slow (sympy): keep the event loop free, and
        # never let one hold the reward stage forever.
        try:
            async with asyncio.timeout(SCORE_TIMEOUT_S):
                return await asyncio.to_thread(
                    functools.partial(
                        rg_scoring.raw_score,
                        data["dataset"],
                        answer,
                        data["entry"],
                        data["config"],
                        seed=int(data.get("seed", rg_scoring.DATASET_SEED)),
                        size=int(data.get("size", rg_scoring.INDEX_SPACE)),
                    )
                )
        except TimeoutError:
            return 0.0

    def _reward(self, raw: float) -> float:
        if self.options.partial_credit:
            return raw
        return 1.0 if raw >= 1.0 else 0.0

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """Submit the stored answer (printed with `python` first, when that tool is on and the
        answer is short)."""
        answer = str(task.data["entry"]["answer"])
        submit = ToolCall(name="finish", arguments={"answer": answer})
        if not self.options.python or len(answer) > _ORACLE_TRY_CHARS:
            return [submit]
        show = ToolCall(name="python", arguments={"code": f"print({answer!r})"})
        return [show, submit]


def _drawer(name: str, config: dict[str, Any]) -> Any:
    """The `sample_instances` draw of dataset `name` built with `config`: a random entry whose
    stored answer scores 1.0, keyed by (name, question)."""

    def draw(rng: random.Random) -> tuple[str, dict[str, Any]]:
        for _ in range(_ORACLE_TRIES):
            index = rng.randrange(rg_scoring.INDEX_SPACE)
            entry = rg_scoring.json_entry(rg_scoring.dataset(name, config)[index])
            answer = entry.get("answer")
            if answer is not None and rg_scoring.raw_score(name, str(answer), entry, config) >= 1:
                data = {"dataset": name, "config": config, "index": index, "entry": entry}
                return json.dumps([name, entry["question"]]), data
        raise ValueError(
            f"reasoning-gym dataset {name!r}: {_ORACLE_TRIES} entries in a row whose stored "
            "answer does not score 1.0 under its own scorer; this dataset has no usable oracle"
        )

    return draw


def _package_dir() -> Path:
    """The installed `reasoning_gym` package folder (hidden from the `python` sandbox)."""
    import reasoning_gym

    return Path(reasoning_gym.__file__).parent
