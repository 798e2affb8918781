"""Registries: the names config files use for pluggable parts, and each part's spec.

Every kind of part (dispatch strategy, advantage estimator, policy loss, engine, runtime,
executor, task family, training backend) registers ONE spec per name: the name, a typed options
model, the thing that builds the part, and the capabilities the rest of the system asks about
(a family's runtimes and reward budget, a backend's sampler, an engine's need of a URL...). Config
validates names and options against the specs, and the app asks a spec's capabilities instead of
comparing names, so a part a plugin registers is treated like a built-in. Nothing is built to
validate: capabilities are data, or small functions of the part's validated options.

A part registers itself where it is defined: ``@STRATEGIES.register("pipeline", run_pool=...)``
builds the registry's spec type around the decorated class or function, and ``REG.add(spec)``
registers a spec made by hand. `build` is typed `Callable[..., Any]` here; each layer calls it
through a typed wrapper (`conveyor.engines.factory.build_engine`, `dispatch.factory`, ...).

The built-in parts live in heavier layers, so each registry knows only the *module* that
registers each built-in name and imports it on first use. This module imports nothing of
conveyor, not even for types, which keeps it at the bottom of the layers and out of any
import loop.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "ADVANTAGES",
    "BACKENDS",
    "ENGINES",
    "EXECUTORS",
    "FAMILIES",
    "LOSSES",
    "RUNTIMES",
    "STRATEGIES",
    "AdvantageSpec",
    "BackendSpec",
    "EngineSpec",
    "ExecutorSpec",
    "FamilySpec",
    "LossSpec",
    "NoOptions",
    "PartSpec",
    "Registry",
    "RuntimeSpec",
    "StrategySpec",
    "UnknownName",
]


class NoOptions(BaseModel):
    """The options of a part that takes none: any key is refused, naming it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def options_problems(error: ValidationError) -> str:
    """A pydantic error as `key: message` pairs, the way config errors name keys."""
    return "; ".join(
        f"{'.'.join(str(x) for x in e['loc']) or '(root)'}: {e['msg']}" for e in error.errors()
    )


@dataclass(frozen=True, kw_only=True)
class PartSpec:
    """What every part declares: its name, its options model and what builds it.

    `options` is a pydantic model (extra keys forbidden, as `NoOptions`); config holds the part
    as ``{name, options}`` and validates `options` with it. `build` makes the part; what it
    takes depends on the kind (each kind's spec says so). `summary` is one line for listings.
    """

    name: str
    build: Callable[..., Any]
    options: type[BaseModel] = NoOptions
    summary: str = ""

    def validate_options(self, raw: Mapping[str, Any] | BaseModel | None, key: str) -> BaseModel:
        """`raw` checked against the options model; `ValueError` naming `key.<option>` of each
        bad or unknown option."""
        if isinstance(raw, self.options):
            return raw
        if isinstance(raw, BaseModel):
            raw = raw.model_dump()
        try:
            return self.options.model_validate(dict(raw or {}))
        except ValidationError as error:
            problems = "; ".join(
                f"{key}.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
                if e["loc"]
                else f"{key}: {e['msg']}"
                for e in error.errors()
            )
            raise ValueError(f"bad options of {self.name!r}: {problems}") from None


@dataclass(frozen=True, kw_only=True)
class StrategySpec(PartSpec):
    """A dispatch strategy; `build(engine_stages, settings, engine=, telemetry=)` is its class
    (its options are `settings.strategy.options`).

    - `run_pool`: the `dispatch` key that bounds its run stage (every rollout there holds a
      runtime, so `dispatch.max_live_runtimes` must admit it);
    - `tunes_itself`: it sets its own pool widths while it runs (the configured ones are only
      its start point), so a benchmark does not search them nor run it at fixed defaults.
    """

    run_pool: str = "max_parallel"
    tunes_itself: bool = False


@dataclass(frozen=True, kw_only=True)
class AdvantageSpec(PartSpec):
    """An advantage estimator; `build(**options)` is the estimator (group rewards ->
    advantages), its options model's fields as keyword arguments."""


@dataclass(frozen=True, kw_only=True)
class LossSpec(PartSpec):
    """A policy loss; `build(options)` is the loss the built-in trainer calls per micro-batch
    (`conveyor.trainer.losses.PolicyLoss`)."""


@dataclass(frozen=True, kw_only=True)
class EngineSpec(PartSpec):
    """A sampling engine kind; `build(config, model_path)` is the client
    (`conveyor.engines.factory.build_engine` calls it; its options are `config.engine.options`).

    - `weight_updates`: takes new weights in place (training can sync into it);
    - `kv_stats`: reports KV-cache statistics;
    - `needs_base_url`: reaches a server by URL (`engine.base_url` / `engine.base_urls`);
    - `replicas`: can start N local servers behind the router (`engine.replicas`,
      `cluster.engine_resource`).
    """

    weight_updates: bool = False
    kv_stats: bool = False
    needs_base_url: bool = False
    replicas: bool = False


@dataclass(frozen=True, kw_only=True)
class RuntimeSpec(PartSpec):
    """A runtime kind; `build(request, settings)` is a runtime for one rollout (its options are
    `settings.options`).

    - `needs_image`: its sandboxes run an image (`runtime.docker_image`);
    - `hides_paths`: its sandboxes can show host folders empty (`RuntimeRequest.hidden`, e.g. a
      dataset's package holding the graders' answers), and bind host folders read-only over
      a host workspace (what the SWE grader's test sandbox needs);
    - `unsandboxed`: its commands run as plain processes on this host, with no isolation (only
      for code one trusts);
    - `available()`: whether it can run here, and why not (None: nothing to check).
    """

    needs_image: bool = False
    hides_paths: bool = False
    unsandboxed: bool = False
    available: Callable[[], tuple[bool, str]] | None = None


@dataclass(frozen=True, kw_only=True)
class ExecutorSpec(PartSpec):
    """Where the dispatch stages run; `build(**options)` is the executor, its options model's
    fields as keyword arguments (`dispatch.executor.options`).

    `in_process`: the stages run in this process (where the agent loop and the cluster
    section's own actors are driven from), so a warm pool of runtimes started here can serve
    them; an executor that starts runtimes elsewhere cannot host one."""

    in_process: bool = False


def _no_budget(options: BaseModel) -> float | None:
    return None


@dataclass(frozen=True, kw_only=True)
class FamilySpec(PartSpec):
    """A task family; `build(...)` is its class (`conveyor.tasks.family.get_family` builds it).

    - `options`: the model of its `tasks.options.<name>` entry;
    - `runtimes`: the runtime kinds it can use, its default first; None: it takes no runtime
      settings (only `runtime.kind: auto`);
    - `splits`, `source`, `version`: what `conveyor tasks families` lists;
    - `hint_policy`: the agent loop's hint policy class for its rollouts (None: the default);
    - `reward_budget_s(options)`: the longest its grading may take, from its validated options
      (None: no stated budget), checked against `dispatch.reward_timeout_s` without building it;
    - `resolve_options(entry)`: its `tasks.options` entry as the run uses it (checked and
      recorded when the config loads), or None.
    """

    runtimes: tuple[str, ...] | None = None
    splits: tuple[str, ...] = ("train", "eval", "test")
    source: str = "generated"
    version: str = "1"
    hint_policy: Any = None
    reward_budget_s: Callable[[Any], float | None] = _no_budget
    resolve_options: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True, kw_only=True)
class BackendSpec(PartSpec):
    """A training backend; `build(config, model_dir, settings)` is the `TrainingBackend`
    (its options are `config.trainer.backend.options`).

    - `info()`: what `conveyor backends` says of it (cheap, never raises);
    - `refusal(config, engine)`: why it cannot sync weights into `engine`, or None;
    - `sampler`: the engine kind it brings (a config that leaves `engine.kind` unset samples
      with it), or None;
    - `exports_model`: it can write the trained model as a Hugging Face folder (what a warm
      start hands to RL);
    - `distributed`: it runs on a Ray cluster (needs `cluster.address`, may use
      `cluster.trainer_workers` > 1);
    - `warm_start`: it can run the supervised warm start (`rl.warm_start.steps`).
    """

    info: Callable[[], Any]
    refusal: Callable[[Any, Any], str | None]
    sampler: str | None = None
    exports_model: bool = False
    distributed: bool = False
    warm_start: bool = False


C = TypeVar("C", bound=Callable[..., Any])
S = TypeVar("S", bound=PartSpec)


class UnknownName(KeyError):
    """A name no part of the kind is registered under; the message lists the known ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[S]):
    """Names -> specs of one kind of part.

    `builtins` maps each built-in name to the module whose import registers it, so listing the
    names (what config validation needs) imports nothing and asking for a part imports only its
    own module.
    """

    def __init__(
        self,
        kind: str,
        spec_type: type[S],
        builtins: Mapping[str, str] | None = None,
        elsewhere: Mapping[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.spec_type = spec_type
        self._builtins = dict(builtins or {})
        # Names that are not parts of this kind but that users may try (why, and what instead).
        self._elsewhere = dict(elsewhere or {})
        self._parts: dict[str, S] = {}

    def register(self, name: str | None = None, **declared: Any) -> Callable[[C], C]:
        """Decorator: register the decorated class or function as the `build` of a spec named
        `name` (default: its `name` attribute), with the spec fields `declared`.

        A class registered under a given name gets that name as its `name` attribute.
        """

        def decorator(part: C) -> C:
            key = name if name is not None else vars(part).get("name")
            if not isinstance(key, str) or not key:
                raise TypeError(
                    f"{self.kind} {part!r} needs a name: pass one to register() or give the "
                    "class a non-empty `name` attribute"
                )
            self.add(self.spec_type(name=key, build=part, **declared))
            if name is not None and isinstance(part, type):
                part.name = name  # type: ignore[attr-defined]
            return part

        return decorator

    def add(self, spec: S) -> S:
        """Register `spec` under its name; another spec under a taken name is an error."""
        if not isinstance(spec, self.spec_type):
            raise TypeError(
                f"a {self.kind} registers a {self.spec_type.__name__}, not {type(spec).__name__}"
            )
        if not isinstance(spec.name, str) or not spec.name:
            raise TypeError(
                f"{self.kind} {spec.build!r} needs a name: pass one to register() or give the "
                "class a non-empty `name` attribute"
            )
        existing = self._parts.get(spec.name)
        if existing is not None and existing.build is not spec.build:
            raise ValueError(f"a {self.kind} named {spec.name!r} is already registered")
        self._parts[spec.name] = spec
        return spec

    def spec(self, name: str) -> S:
        """The spec registered as `name`, importing its built-in module on first use."""
        if name not in self._parts and name in self._builtins:
            importlib.import_module(self._builtins[name])
        try:
            return self._parts[name]
        except KeyError:
            raise UnknownName(self.unknown_message(name)) from None

    def get(self, name: str) -> Any:
        """What builds the part registered as `name` (its spec's `build`)."""
        return self.spec(name).build

    def names(self) -> list[str]:
        """Every name that can be asked for (built-ins without importing them), sorted."""
        return sorted({*self._builtins, *self._parts})

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._parts or name in self._builtins)

    def unknown_message(self, name: str) -> str:
        """Why `name` is not a valid choice: the known names and the nearest one."""
        known = self.names()
        message = f"unknown {self.kind} {name!r}; known: {', '.join(known) or 'none'}"
        if name in self._elsewhere:
            return f"{message} ({self._elsewhere[name]})"
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


def replace(spec: S, **changes: Any) -> S:
    """`spec` with some fields changed (a test's variant of a registered part)."""
    return dataclasses.replace(spec, **changes)


def _same_module(module: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, module)


STRATEGIES: Registry[StrategySpec] = Registry(
    "dispatch strategy",
    StrategySpec,
    {
        "batch": "conveyor.dispatch.batch",
        "bounded_batch": "conveyor.dispatch.bounded_batch",
        "bounded_batch_overlap": "conveyor.dispatch.bounded_batch_overlap",
        "pipeline": "conveyor.dispatch.pipeline",
        "auto": "conveyor.dispatch.auto",
    },
)
ADVANTAGES: Registry[AdvantageSpec] = Registry(
    "advantage estimator",
    AdvantageSpec,
    _same_module("conveyor.trainer.advantages", "grpo", "rloo", "reinforce_pp", "fixed_baseline"),
)
LOSSES: Registry[LossSpec] = Registry(
    "policy loss", LossSpec, {"ppo_clip": "conveyor.trainer.policy_losses"}
)
ENGINES: Registry[EngineSpec] = Registry(
    "engine kind",
    EngineSpec,
    {
        **_same_module("conveyor.engines.factory", "vllm", "openai", "simulated", "hf"),
        "tinker": "conveyor.bridges.tinker",
    },
)
RUNTIMES: Registry[RuntimeSpec] = Registry(
    "runtime kind",
    RuntimeSpec,
    {
        "simulated": "conveyor.runtime.simulated",
        "local": "conveyor.runtime.local",
        "bubblewrap": "conveyor.runtime.bubblewrap",
        "docker": "conveyor.runtime.docker",
        "container": "conveyor.runtime.docker",
    },
)
EXECUTORS: Registry[ExecutorSpec] = Registry(
    "dispatch executor",
    ExecutorSpec,
    {"asyncio": "conveyor.dispatch.executors", "ray": "conveyor.dispatch.ray_executor"},
)
FAMILIES: Registry[FamilySpec] = Registry(
    "task family",
    FamilySpec,
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
        "usertasks": "conveyor.tasks.usertasks",
    },
)
_EXTERNAL_DRIVER = (
    "an external driver: its own trainer drives conveyor's rollouts, so it is run by its "
    "bridge, not named as trainer.backend; `conveyor backends` says how"
)
BACKENDS: Registry[BackendSpec] = Registry(
    "training backend",
    BackendSpec,
    {
        "builtin": "conveyor.trainer.builtin",
        "ray_fsdp": "conveyor.trainer.ray_fsdp",
        "tinker": "conveyor.bridges.tinker",
    },
    elsewhere={"verl": _EXTERNAL_DRIVER, "skyrl": _EXTERNAL_DRIVER},
)
