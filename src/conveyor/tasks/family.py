"""The task-family protocol, the registry of families by name, and split-safe instance sampling.

A family generates task instances and everything a rollout of one needs: its tools, a started
runtime, a scorer and an oracle. Config files name families; `@register_family` registers a class in
`conveyor.registry.FAMILIES`. A family is built once per run with the `runtime` settings
(`Family(runtime=RuntimeConfig(...))`) and refuses then a `runtime.kind` it cannot use.

Splits never overlap: which split an instance belongs to is a function of its content (a hash of
its canonical key), not of the seed, so no seed can put an evaluation instance into training.
A family built from a fixed dataset (HumanEval, BFCL, tau2) assigns splits the same way, by a
hash of the instance's own id, and says so in its `splits` attribute.

Every family makes its instances with the helpers at the end of this module, so ids, seeds and
orders follow one rule: `sample_instances` draws a generated family's instances,
`shuffled_pool` orders a fixed dataset's, `instance_task` builds each `Task` (its id from
`task_id`), and a constructor takes its runtime settings and kind from `runtime_choice`.

Optional parts a family may have, each found by `isinstance` against its protocol here:
- `Conversational.user_turn`: a user answers each text reply of the agent (BFCL's next question,
  tau2's simulated customer); the loop's `user_turn` hook;
- `PerTaskTools.tools_for`: the tools differ between instances (BFCL's classes);
- `Grading.grade`: a `Grade` with a breakdown and records (a judge's prompt and verdict) instead
  of a bare `score`, reading the whole trajectory;
- `Demonstrating.demonstration_calls`: what a warm start imitates instead of the oracle
  (traces that teach the tool format but leave the plan to RL; they need not solve the task);
- class attributes `source` (where the instances come from) and `version` (of that source, so a
  result can name its data), listed by `conveyor tasks families`;
- a constructor taking `services` (`FamilyServices`): its `tasks.options` entry and clients for
  the models that play a part (a simulated user, a judge);
- attribute `malformed_call_ends_turn` (a conversational family, BFCL): a reply whose calls do
  not parse ends the user turn instead of drawing a hint or ending the rollout;
- `config_problems(config) -> list[str]`: what in the run's config makes its number
  incomparable with the benchmark's published one (printed as NOT COMPARABLE; refused when its
  options set `benchmark` without `allow_incomparable`: `conveyor.app.compose`);
- `dropped(split) -> list[str]`: instances of `split` it leaves out, which `tasks check` lists;
- a class method `resolve_options(options) -> dict`: its `tasks.options` entry as the run uses
  it, called when the config loads (a `ValueError` refuses the config), so the run's
  `config.yaml` records what was used (swe: row files as absolute paths with content hashes).
"""

from __future__ import annotations

import hashlib
import inspect
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ValidationError

from conveyor.agent.tools import ToolRegistry
from conveyor.config.sections import AUTO, RuntimeConfig
from conveyor.registry import FAMILIES, FamilySpec, NoOptions
from conveyor.runtime.base import Runtime
from conveyor.runtime.selection import choose_runtime
from conveyor.types import FamilyServices, Message, Task, ToolCall, Trajectory

T = TypeVar("T")
F = TypeVar("F", bound="TaskFamily")

# Share of the instance space (in percent) that belongs to each split.
SPLIT_SHARES: dict[str, int] = {"train": 80, "eval": 10, "test": 10}

# Draws per requested instance before `sample_instances` decides the space is exhausted.
_DRAWS_PER_INSTANCE = 200


@runtime_checkable
class TaskFamily(Protocol):
    """A generator of task instances plus the tools, runtime, scorer and oracle they need.

    A family may set the class attribute `reward_from_agent = True` (not part of the protocol,
    read with `getattr`): then an outside agent program's `finish` reward is the reward of its
    rollouts (`gateway.external`), for tasks only that program can judge. Every other family
    grades with `score`, whatever the program says.
    """

    name: str

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct instances of `split`, the same for the same arguments.

        Ids look like ``arithmetic-eval-0007``; a larger `n` extends a smaller one. Instances of
        different splits never coincide, whatever the seeds.
        """
        ...

    def tools(self) -> ToolRegistry:
        """A fresh registry of the tools the agent may call, `finish` included."""
        ...

    async def make_runtime(self, task: Task) -> Runtime:
        """A started runtime for one rollout of `task`."""
        ...

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """1.0 if `answer` (what `finish` submitted, None if never called) is right, else 0.0."""
        ...

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """A correct tool-call sequence for `task` that ends with `finish`."""
        ...


# An oracle step that is a plain text reply, not a tool call (a conversational family's oracle
# ends each user turn with one): `ToolCall(name=SAY, arguments={"text": ...})`.
SAY = "_say"


def say(text: str) -> ToolCall:
    """The oracle step "reply `text` without calling a tool"."""
    return ToolCall(name=SAY, arguments={"text": text})


# An oracle step that is one reply holding several tool calls (BFCL's parallel calls, where one
# user turn needs more calls than its step limit): `ToolCall(name=CALLS, arguments={"calls":
# [ToolCall.model_dump(), ...]})`.
CALLS = "_calls"


def several(calls: Sequence[ToolCall]) -> ToolCall:
    """The oracle step "make all of `calls` in one reply"."""
    return ToolCall(name=CALLS, arguments={"calls": [c.model_dump() for c in calls]})


@runtime_checkable
class Conversational(Protocol):
    """A family whose user answers the agent's text replies (see `conveyor.agent.loop`)."""

    async def user_turn(self, task: Task, runtime: Runtime | None, reply: str) -> str | None:
        """The user's next message after the agent's text reply `reply`; None ends the
        conversation (the rollout is then `ok`, and graded)."""
        ...


@runtime_checkable
class Demonstrating(Protocol):
    """A family whose warm start imitates demonstrations rather than its oracle."""

    def demonstration_calls(self, task: Task) -> list[ToolCall]:
        """The tool calls a warm start imitates for `task`, ending with `finish`; they follow
        the tool format and may submit a wrong answer (the plan is left to RL)."""
        ...


@runtime_checkable
class PerTaskTools(Protocol):
    """A family whose tool set depends on the instance."""

    def tools_for(self, task: Task) -> ToolRegistry:
        """A fresh registry of the tools of `task`."""
        ...


@dataclass(frozen=True)
class Grade:
    """A graded rollout: the reward, its named parts (into `Trajectory.metrics` as
    ``reward/<name>``) and records to keep with the trajectory (e.g. a judge's prompt and
    verdict, as `_meta` messages)."""

    reward: float
    breakdown: Mapping[str, float] = field(default_factory=dict)
    records: list[Message] = field(default_factory=list)


@runtime_checkable
class Grading(Protocol):
    """A family that grades the whole trajectory (used instead of `score`)."""

    async def grade(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Grade:
        """The `Grade` of one rollout; the graded process can never write what this reads."""
        ...


OptionsT = TypeVar("OptionsT", bound=BaseModel)


def family_options(name: str, model: type[OptionsT], options: Mapping[str, Any]) -> OptionsT:
    """`options` (the `tasks.options.<name>` mapping) checked against the family's options
    model; a `ValueError` naming the family and the bad keys (unknown keys are refused when the
    model forbids extras, as it should)."""
    try:
        return model.model_validate(dict(options))
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or '(root)'}: {e['msg']}" for e in error.errors()
        )
        raise ValueError(f"tasks.options.{name}: {problems}") from None


def family_info(name: str) -> dict[str, Any]:
    """`{"name", "splits", "source", "version"}` of a registered family (the `conveyor tasks
    families --json` contract), read from its spec without building it."""
    spec = FAMILIES.spec(name)
    return {
        "name": name,
        "splits": list(spec.splits),
        "source": spec.source,
        "version": spec.version,
    }


_NOT_DECLARED = object()


def _declared(cls: type, name: str, default: Any) -> Any:
    """The class attribute `name` as the family class (or a base) declares it, else `default`:
    read once, here, into the family's spec."""
    for klass in cls.__mro__:
        value = vars(klass).get(name, _NOT_DECLARED)
        if value is not _NOT_DECLARED:
            return value.__func__ if isinstance(value, classmethod | staticmethod) else value
    return default


def _bound(cls: type, function: Any) -> Any:
    """A class method read from the class body, bound to `cls` again."""
    return None if function is None else function.__get__(cls, cls)


def register_family(
    cls: type[F] | None = None,
    /,
    *,
    options: type[BaseModel] = NoOptions,
    reward_budget_s: Callable[[Any], float | None] | None = None,
) -> Any:
    """Class decorator (bare or with arguments): register a family under its `name` as a
    `FamilySpec` (`FAMILIES`), so config validation and the run ask the spec, never an instance.

    The spec takes the class's declarations: `runtimes` (a family whose constructor takes no
    `runtime` has none), `splits`, `source`, `version`, `hint_policy` and the class method
    `resolve_options`; and from the arguments: `options`, the model of its `tasks.options`
    entry, and `reward_budget_s(options)`, the longest its grading may take given those options
    (checked against `dispatch.reward_timeout_s` without building the family).
    """

    def decorator(family: type[F]) -> type[F]:
        FAMILIES.add(family_spec(family, options=options, reward_budget_s=reward_budget_s))
        return family

    return decorator if cls is None else decorator(cls)


def family_spec(
    family: type,
    *,
    options: type[BaseModel] = NoOptions,
    reward_budget_s: Callable[[Any], float | None] | None = None,
) -> FamilySpec:
    """The `FamilySpec` `register_family` registers for `family` (see there)."""
    runtimes = _declared(family, "runtimes", None)
    return FamilySpec(
        name=_declared(family, "name", ""),
        build=family,
        options=options,
        runtimes=tuple(runtimes) if runtimes is not None else None,
        splits=tuple(_declared(family, "splits", tuple(SPLIT_SHARES))),
        source=str(_declared(family, "source", "generated")),
        version=str(_declared(family, "version", "1")),
        hint_policy=_declared(family, "hint_policy", None),
        reward_budget_s=reward_budget_s or _no_budget,
        resolve_options=_bound(family, _declared(family, "resolve_options", None)),
    )


def _no_budget(options: Any) -> float | None:
    return None


def get_family(
    name: str, runtime: RuntimeConfig | None = None, services: FamilyServices | None = None
) -> TaskFamily:
    """A new instance of the family registered as `name`, built with the `runtime` settings
    (and `services`, when its constructor takes them).

    `UnknownName` naming the known families; `ValueError` when the family cannot use
    `runtime.kind`, or when options are given to a family that takes none. A family whose
    constructor takes no `runtime` runs only with `auto`.
    """
    factory = FAMILIES.get(name)
    settings = runtime if runtime is not None else RuntimeConfig()
    if _takes(factory, "services"):
        kwargs: dict[str, Any] = {"services": services or FamilyServices()}
        if _takes(factory, "runtime"):
            kwargs["runtime"] = settings
        return factory(**kwargs)
    if services is not None and services.options:
        raise ValueError(
            f"task family {name!r} takes no options, but tasks.options.{name} sets "
            f"{', '.join(sorted(services.options))}"
        )
    if _takes(factory, "runtime"):
        return factory(runtime=settings)
    if settings.kind != AUTO:
        raise ValueError(
            f"task family {name!r} takes no runtime settings, so runtime.kind must be 'auto', "
            f"not {settings.kind!r}"
        )
    return factory()


def build_families(
    names: Iterable[str],
    runtime: RuntimeConfig | None = None,
    services: Callable[[str], FamilyServices] | None = None,
) -> dict[str, TaskFamily]:
    """One instance of each named family with the same runtime settings (what a run holds);
    `services(name)` gives each its options and clients."""
    return {
        name: get_family(name, runtime, services(name) if services else None)
        for name in dict.fromkeys(names)
    }


def options_services(options: Mapping[str, Mapping[str, Any]]) -> Callable[[str], FamilyServices]:
    """`build_families`' `services` for a process that has a config but no side models: each
    family gets its `tasks.options` entry (so its rows and settings are the config's, not a
    default's) and no user or judge client."""
    return lambda name: FamilyServices(options=dict(options.get(name) or {}))


def _takes(factory: Callable[..., object], parameter: str) -> bool:
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: assume the protocol
        return parameter == "runtime"
    if parameter in parameters:
        return True
    return parameter == "runtime" and any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def split_of(key: str) -> str:
    """The split an instance with canonical key `key` belongs to (a stable hash bucket)."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 100
    for split, share in SPLIT_SHARES.items():
        if bucket < share:
            return split
        bucket -= share
    raise AssertionError("SPLIT_SHARES must add up to 100")


def sample_instances(
    family: str, n: int, seed: int, split: str, draw: Callable[[random.Random], tuple[str, T]]
) -> list[T]:
    """`n` distinct instances of `split`, drawn with an RNG derived from (family, seed, split).

    `draw` returns an instance and its canonical key (equal keys mean equal instances); draws
    whose key hashes into another split, or repeats, are skipped. Raises `ValueError` for an
    unknown split or when the family cannot supply `n` distinct instances.
    """
    check_split(split)
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    # A string seed is hashed with SHA-512 by `random`, so this is stable across processes.
    rng = random.Random(f"{family}/{seed}/{split}")
    seen: set[str] = set()
    out: list[T] = []
    for _ in range(n * _DRAWS_PER_INSTANCE):
        if len(out) == n:
            break
        key, instance = draw(rng)
        if key in seen or split_of(key) != split:
            continue
        seen.add(key)
        out.append(instance)
    if len(out) < n:
        raise ValueError(
            f"task family '{family}' found only {len(out)} distinct '{split}' instances of {n}"
        )
    return out


def task_id(family: str, split: str, index: int) -> str:
    """The id of instance `index` of a split, e.g. ``arithmetic-eval-0007``."""
    return f"{family}-{split}-{index:04d}"


def check_split(split: str, splits: Iterable[str] = SPLIT_SHARES) -> None:
    """`ValueError` unless `split` is one of `splits`."""
    names = list(splits)
    if split not in names:
        raise ValueError(f"unknown split '{split}'; expected one of {', '.join(names)}")


def runtime_choice(
    family: str, runtime: RuntimeConfig | None, supported: Sequence[str]
) -> tuple[RuntimeConfig, str]:
    """A family's runtime settings (the defaults when the run gives none) and the kind it runs
    with: what every family's constructor takes from `runtime`."""
    settings = runtime if runtime is not None else RuntimeConfig()
    return settings, choose_runtime(family, settings, supported)


def shuffled_pool(
    family: str, pool: Iterable[T], n: int, seed: int, split: str, shortage: Callable[[int], str]
) -> list[T]:
    """`n` instances of a fixed dataset's `split`: `pool` (the split's instances in a fixed
    order) shuffled by an RNG derived from (family, seed, split), cut to `n`, so a larger `n`
    extends a smaller. `ValueError` for a negative `n`, or `shortage(len(pool))` when the pool
    holds fewer than `n`. (A generated family draws with `sample_instances` instead.)"""
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    items = list(pool)
    random.Random(f"{family}/{seed}/{split}").shuffle(items)
    if len(items) < n:
        raise ValueError(shortage(len(items)))
    return items[:n]


def opening(system: str, user: str) -> list[Message]:
    """The prompt most instances start with: a system message and the user's request."""
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def instance_task(
    family: str,
    split: str,
    index: int,
    prompt: list[Message],
    data: dict[str, Any],
    name: str = "",
) -> Task:
    """Instance `index` of `split`: its id is ``<family>-<split>-<index:04d>``, with ``-<name>``
    after it where the instance has a name of its own in its source (a dataset's id, a task
    folder), so a log line says which."""
    suffix = f"-{name}" if name else ""
    return Task(
        id=f"{task_id(family, split, index)}{suffix}",
        family=family,
        prompt=prompt,
        data=data,
        split=split,
    )
