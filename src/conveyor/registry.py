"""Registries: the names config files use for pluggable parts, and what each name means.

One small generic `Registry` serves every kind of part: dispatch strategies, advantage
estimators, engines, runtimes, executors and task families. A part registers itself with a
decorator where it is defined (``@STRATEGIES.register("pipeline")``); config validates a name
against the registry (``conveyor.config``), so a part a user registers in their own module can be
named in YAML once that module is listed under ``plugins:``.

The built-in parts live in heavier layers, so each registry knows only the *module* that
registers each built-in name and imports it on first use. This module imports nothing of
conveyor at run time, which keeps it at the bottom of the layers and free of import loops.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from conveyor.dispatch.base import Dispatcher
    from conveyor.dispatch.executors import Executor
    from conveyor.engines.factory import EngineBuilder
    from conveyor.runtime.selection import RuntimeBuilder
    from conveyor.tasks.family import TaskFamily
    from conveyor.trainer.advantages import AdvantageEstimator
    from conveyor.trainer.backend import BackendSpec

__all__ = [
    "ADVANTAGES",
    "BACKENDS",
    "ENGINES",
    "EXECUTORS",
    "FAMILIES",
    "RUNTIMES",
    "STRATEGIES",
    "Registry",
    "UnknownName",
]

T = TypeVar("T")
P = TypeVar("P")


class UnknownName(KeyError):
    """A name no part of the kind is registered under; the message lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Names -> parts of one kind.

    `builtins` maps each built-in name to the module whose import registers it, so listing the
    names (what config validation needs) imports nothing and asking for a part imports only its
    own module.
    """

    def __init__(self, kind: str, builtins: Mapping[str, str] | None = None) -> None:
        self.kind = kind
        self._builtins = dict(builtins or {})
        self._parts: dict[str, T] = {}

    def register(self, name: str | None = None) -> Callable[[P], P]:
        """Decorator: register the decorated part as `name` (default: its `name` attribute).

        A class registered under a given name gets that name as its `name` attribute.
        """

        def decorator(part: P) -> P:
            key = name if name is not None else getattr(part, "name", None)
            if not isinstance(key, str) or not key:
                raise TypeError(
                    f"{self.kind} {part!r} needs a name: pass one to register() or give the "
                    "class a non-empty `name` attribute"
                )
            self.add(key, part)  # type: ignore[arg-type]
            if name is not None and isinstance(part, type):
                part.name = name  # type: ignore[attr-defined]
            return part

        return decorator

    def add(self, name: str, part: T) -> None:
        """Register `part` as `name`; registering another part under a taken name is an error."""
        existing = self._parts.get(name)
        if existing is not None and existing is not part:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        self._parts[name] = part

    def get(self, name: str) -> T:
        """The part registered as `name`, importing its built-in module on first use."""
        if name not in self._parts and name in self._builtins:
            importlib.import_module(self._builtins[name])
        try:
            return self._parts[name]
        except KeyError:
            raise UnknownName(self.unknown_message(name)) from None

    def names(self) -> list[str]:
        """Every name that can be asked for (built-ins without importing them), sorted."""
        return sorted({*self._builtins, *self._parts})

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._parts or name in self._builtins)

    def unknown_message(self, name: str) -> str:
        """Why `name` is not a valid choice: the known names and the nearest one."""
        known = self.names()
        message = f"unknown {self.kind} {name!r}; known: {', '.join(known) or 'none'}"
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        if close:
            message += f" (did you mean {close[0]!r}?)"
        return message + (
            "; a part registered in your own module is known once the module is listed under "
            "`plugins:` in the config"
        )

    def check(self, name: str) -> str:
        """`name` if it is registered (for config validators); `ValueError` otherwise."""
        if name not in self:
            raise ValueError(self.unknown_message(name))
        return name


def _same_module(module: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, module)


STRATEGIES: Registry[type[Dispatcher]] = Registry(
    "dispatch strategy",
    {
        "batch": "conveyor.dispatch.batch",
        "bounded_batch": "conveyor.dispatch.bounded_batch",
        "bounded_batch_overlap": "conveyor.dispatch.bounded_batch_overlap",
        "pipeline": "conveyor.dispatch.pipeline",
        "auto": "conveyor.dispatch.auto",
    },
)
ADVANTAGES: Registry[type[AdvantageEstimator]] = Registry(
    "advantage estimator",
    _same_module("conveyor.trainer.advantages", "grpo", "rloo", "reinforce_pp"),
)
ENGINES: Registry[EngineBuilder] = Registry(
    "engine kind",
    {
        **_same_module("conveyor.engines.factory", "vllm", "openai", "simulated", "hf"),
        "tinker": "conveyor.bridges.tinker",
    },
)
RUNTIMES: Registry[RuntimeBuilder] = Registry(
    "runtime kind",
    {
        "simulated": "conveyor.runtime.simulated",
        "local": "conveyor.runtime.local",
        "bubblewrap": "conveyor.runtime.bubblewrap",
        "docker": "conveyor.runtime.docker",
    },
)
EXECUTORS: Registry[Callable[[], Executor]] = Registry(
    "dispatch executor",
    {"asyncio": "conveyor.dispatch.executors", "ray": "conveyor.dispatch.ray_executor"},
)
FAMILIES: Registry[Callable[..., TaskFamily]] = Registry(
    "task family",
    {
        "arithmetic": "conveyor.tasks.arithmetic",
        "filenav": "conveyor.tasks.filenav",
        "filing": "conveyor.tasks.filing",
        "swe": "conveyor.tasks.swe.family",
        "search": "conveyor.tasks.search",
        "memory": "conveyor.tasks.memory",
        "math": "conveyor.tasks.math",
        "code": "conveyor.tasks.code",
        "rg": "conveyor.tasks.rg",
        "bfcl": "conveyor.tasks.bfcl",
        "tau2": "conveyor.tasks.tau2",
        "terminal": "conveyor.tasks.terminal",
    },
)
BACKENDS: Registry[BackendSpec] = Registry(
    "training backend",
    {
        "builtin": "conveyor.trainer.builtin",
        "ray_fsdp": "conveyor.trainer.ray_fsdp",
        "tinker": "conveyor.bridges.tinker",
        "verl": "conveyor.bridges.verl",
        "skyrl": "conveyor.bridges.skyrl",
    },
)
