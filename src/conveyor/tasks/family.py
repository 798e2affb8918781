"""The task-family protocol, the registry of families by name, and split-safe instance sampling.

A family generates task instances and everything a rollout of one needs: its tools, a started
runtime, a scorer and an oracle. Config files name families; `@register_family` registers a class in
`conveyor.registry.FAMILIES`. A family is built once per run with the `runtime` settings
(`Family(runtime=RuntimeConfig(...))`) and refuses then a `runtime.kind` it cannot use.

Splits never overlap: which split an instance belongs to is a function of its content (a hash of
its canonical key), not of the seed, so no seed can put an evaluation instance into training.
"""

from __future__ import annotations

import hashlib
import inspect
import random
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar, runtime_checkable

from conveyor.agent.tools import ToolRegistry
from conveyor.config.sections import AUTO, RuntimeConfig
from conveyor.registry import FAMILIES
from conveyor.runtime.base import Runtime
from conveyor.types import Task, ToolCall

T = TypeVar("T")
F = TypeVar("F", bound="TaskFamily")

# Share of the instance space (in percent) that belongs to each split.
SPLIT_SHARES: dict[str, int] = {"train": 80, "eval": 10, "test": 10}

# Draws per requested instance before `sample_instances` decides the space is exhausted.
_DRAWS_PER_INSTANCE = 200


@runtime_checkable
class TaskFamily(Protocol):
    """A generator of task instances plus the tools, runtime, scorer and oracle they need."""

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


def register_family(cls: type[F]) -> type[F]:
    """Class decorator: make a family nameable in config under its `name` (`FAMILIES`)."""
    return FAMILIES.register()(cls)


def get_family(name: str, runtime: RuntimeConfig | None = None) -> TaskFamily:
    """A new instance of the family registered as `name`, built with the `runtime` settings.

    `UnknownName` naming the known families; `ValueError` when the family cannot use
    `runtime.kind`. A family whose constructor takes no `runtime` runs only with `auto`.
    """
    factory = FAMILIES.get(name)
    settings = runtime if runtime is not None else RuntimeConfig()
    if _takes_runtime(factory):
        return factory(runtime=settings)
    if settings.kind != AUTO:
        raise ValueError(
            f"task family {name!r} takes no runtime settings, so runtime.kind must be 'auto', "
            f"not {settings.kind!r}"
        )
    return factory()


def build_families(
    names: Iterable[str], runtime: RuntimeConfig | None = None
) -> dict[str, TaskFamily]:
    """One instance of each named family with the same runtime settings (what a run holds)."""
    return {name: get_family(name, runtime) for name in dict.fromkeys(names)}


def _takes_runtime(factory: Callable[..., object]) -> bool:
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin without a signature: assume the protocol
        return True
    return "runtime" in parameters or any(
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
    if split not in SPLIT_SHARES:
        raise ValueError(f"unknown split '{split}'; expected one of {', '.join(SPLIT_SHARES)}")
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
