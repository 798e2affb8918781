"""The strategy registry: config names a strategy, a decorator registers it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from conveyor.dispatch.base import Dispatcher

_STRATEGIES: dict[str, type[Dispatcher]] = {}
_BUILTIN_MODULES = ("batch", "bounded_batch", "pipeline", "auto")

D = TypeVar("D", bound="type[Dispatcher]")


def register_strategy(name: str) -> Callable[[D], D]:
    """Class decorator: make a `Dispatcher` subclass selectable as `strategy: <name>`."""

    def decorator(cls: D) -> D:
        if name in _STRATEGIES and _STRATEGIES[name] is not cls:
            raise ValueError(f"dispatch strategy {name!r} is already registered")
        _STRATEGIES[name] = cls
        cls.name = name
        return cls

    return decorator


def _load_builtin() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(f"conveyor.dispatch.{module}")


def strategy_names() -> set[str]:
    """Names of every registered strategy."""
    _load_builtin()
    return set(_STRATEGIES)


def strategy_class(name: str) -> type[Dispatcher]:
    """The class registered under `name`; a clear error naming the known ones otherwise."""
    _load_builtin()
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise KeyError(
            f"unknown dispatch strategy {name!r}; known: {sorted(_STRATEGIES)}"
        ) from None
