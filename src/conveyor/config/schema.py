"""The whole configuration of one run (`ConveyorConfig`) and its checks across sections."""

import importlib
from collections.abc import Mapping
from typing import Any, Self

from pydantic import Field, model_validator

from conveyor.config.base import Section
from conveyor.config.cluster import ClusterConfig
from conveyor.config.sections import (
    AUTO,
    AgentConfig,
    DispatchConfig,
    EngineConfig,
    ModelConfig,
    RunConfig,
    RuntimeConfig,
    SamplingConfig,
    TasksConfig,
)
from conveyor.config.training import RLConfig, TrainerConfig
from conveyor.registry import BACKENDS, ENGINES, EXECUTORS, FAMILIES, STRATEGIES


class ConveyorConfig(Section):
    """The whole configuration of one conveyor run."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="The model.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="The sampling engine.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling.")
    agent: AgentConfig = Field(default_factory=AgentConfig, description="The agent loop.")
    tasks: TasksConfig = Field(default_factory=TasksConfig, description="The task set.")
    dispatch: DispatchConfig = Field(default_factory=DispatchConfig, description="Scheduling.")
    runtime: RuntimeConfig = Field(
        default_factory=RuntimeConfig, description="Where each rollout's tools act."
    )
    run: RunConfig = Field(default_factory=RunConfig, description="Run outputs.")
    cluster: ClusterConfig = Field(
        default_factory=ClusterConfig,
        description="Placement on a Ray cluster (none by default: everything in this process).",
    )
    rl: RLConfig = Field(default_factory=RLConfig, description="The RL loop.")
    trainer: TrainerConfig = Field(
        default_factory=TrainerConfig, description="The built-in PyTorch trainer."
    )
    plugins: list[str] = Field(
        default_factory=list,
        description="Python modules imported before the config's names are checked, so the "
        "strategies, advantages, engines, runtimes, executors and task families they register "
        "can be named here (docs/architecture.md, 'Adding a part').",
    )

    @model_validator(mode="before")
    @classmethod
    def _import_plugins(cls, data: Any) -> Any:
        """Import the `plugins` modules first, so the names they register validate below."""
        plugins = data.get("plugins") if isinstance(data, dict) else None
        if isinstance(plugins, list) and all(isinstance(name, str) for name in plugins):
            for module in plugins:
                try:
                    importlib.import_module(module)
                except ImportError as exc:
                    raise ValueError(
                        f"plugins: module {module!r} cannot be imported ({exc}); list importable "
                        "module names (on PYTHONPATH), e.g. plugins: [my_project.parts]"
                    ) from None
        return data

    @model_validator(mode="after")
    def _deadlines_and_bounds_fit(self) -> Self:
        """Refuse settings whose budgets cannot all hold, naming every offending key."""
        problems = [
            *_pool_problems(self.dispatch),
            *_budget_problems(self),
            *_runtime_problems(self),
            *_cluster_problems(self),
            *_loss_problems(self),
        ]
        if problems:
            raise ValueError(
                "settings that cannot work together: " + "; ".join(problems) + " (checked at "
                "start so a run does not find out hours in)"
            )
        return self


def _pool_problems(dispatch: DispatchConfig) -> list[str]:
    """R must admit the strategy's whole run pool, or part of the pool can never run."""
    key = STRATEGIES.spec(dispatch.strategy.name).run_pool
    pool = dispatch.model_dump()[key]
    if dispatch.max_live_runtimes >= pool:
        return []
    return [
        f"dispatch.max_live_runtimes ({dispatch.max_live_runtimes}) is below the run pool "
        f"dispatch.{key} ({pool}) of strategy '{dispatch.strategy.name}': every rollout in the run "
        "stage holds a runtime, so raise R or lower the pool"
    ]


def _budget_problems(config: "ConveyorConfig") -> list[str]:
    agent, dispatch = config.agent, config.dispatch
    problems = []
    if agent.tool_timeout_s > agent.rollout_timeout_s:
        problems.append(
            f"agent.tool_timeout_s ({agent.tool_timeout_s:g}) exceeds agent.rollout_timeout_s "
            f"({agent.rollout_timeout_s:g}): one tool call may outlast the whole rollout"
        )
    for name in config.tasks.families:
        budget = _reward_budget_s(name, config.tasks.options.get(name, {}))
        if budget is not None and dispatch.reward_timeout_s < budget:
            problems.append(
                f"dispatch.reward_timeout_s ({dispatch.reward_timeout_s:g}) is below the "
                f"'{name}' family's grading budget ({budget:g} s): a slow test run the policy "
                "caused would end as an infrastructure error, retried and never scored"
            )
    return problems


def _loss_problems(config: "ConveyorConfig") -> list[str]:
    """A KL-to-reference term needs a reference policy's logprobs of every sampled token, and
    no loop of Conveyor computes them (it keeps no reference model): refused here, not at the
    first training step."""
    kl_coef = getattr(config.trainer.loss.options, "kl_coef", 0.0)
    if not kl_coef:
        return []
    return [
        f"trainer.loss.options.kl_coef ({kl_coef:g}) weights a KL term to a reference policy, "
        "whose logprobs no Conveyor loop computes (no reference model is kept): set it to 0 "
        "(the default; DAPO and Dr. GRPO train without it)"
    ]


def _runtime_problems(config: "ConveyorConfig") -> list[str]:
    """Every configured family must be able to use `runtime.kind` (each declares `runtimes`);
    a warm pool lives in the process that starts the runtimes (the asyncio executor's)."""
    kind = config.runtime.kind
    problems = []
    if config.runtime.warm_pool and not EXECUTORS.spec(config.dispatch.executor.name).in_process:
        problems.append(
            f"runtime.warm_pool ({config.runtime.warm_pool}) needs dispatch.executor 'asyncio', "
            f"not {config.dispatch.executor.name!r} (an executor that runs the stages in this "
            "process): there each runtime starts in an actor of its own, where a pool would keep "
            "idle sandboxes per actor (set warm_pool: 0)"
        )
    if kind == AUTO:
        return problems
    for name in config.tasks.families:
        supported = FAMILIES.spec(name).runtimes
        if supported is not None and kind not in supported:
            problems.append(
                f"runtime.kind ({kind!r}) cannot host the '{name}' family's rollouts; it "
                f"supports {', '.join(supported)} (runtime.kind 'auto' picks {supported[0]!r})"
            )
    return problems


def _cluster_problems(config: "ConveyorConfig") -> list[str]:
    """The trainer's placement and the cluster section must agree (docs/scale.md)."""
    cluster, backend = config.cluster, config.trainer.backend.name
    distributed = BACKENDS.spec(backend).distributed
    problems = []
    if distributed and cluster.address is None:
        problems.append(
            f"trainer.backend {backend!r} runs the trainer as Ray actors, but cluster.address is "
            "null (no Ray): set cluster.address to 'local' (a Ray on this machine) or to the "
            "cluster's address"
        )
    if cluster.trainer_workers > 1 and not distributed:
        problems.append(
            f"cluster.trainer_workers ({cluster.trainer_workers}) needs trainer.backend "
            f"'ray_fsdp' or another distributed one (trainer.backend {backend!r} trains in this "
            "process)"
        )
    engine = config.engine
    if cluster.engine_resource is not None:
        if cluster.address is None:
            problems.append(
                f"cluster.engine_resource {cluster.engine_resource!r} places engine replicas "
                "on a Ray cluster, but cluster.address is null (no Ray)"
            )
        if not ENGINES.spec(engine.kind).replicas:
            problems.append(
                f"cluster.engine_resource starts vLLM servers on the cluster, which needs "
                f"engine.kind 'vllm', not {engine.kind!r} (a kind whose spec has replicas)"
            )
    elif engine.server_args and engine.replicas == 1:
        problems.append(
            "engine.server_args are arguments of the replica servers that engine.replicas > 1 "
            "(or cluster.engine_resource) starts; with one in-process engine nothing reads them"
        )
    if cluster.address is not None and not EXECUTORS.spec(config.dispatch.executor.name).in_process:
        problems.append(
            f"dispatch.executor {config.dispatch.executor.name!r} with cluster.address set: the "
            "cluster section already places every runtime in a Ray actor on a node with "
            f"'{cluster.sandbox_resource}'; leave dispatch.executor at 'asyncio' (where the "
            "agent loop itself runs)"
        )
    return problems


def _reward_budget_s(family_name: str, options: Mapping[str, Any]) -> float | None:
    """The longest a family's `score` may legitimately take, as its spec states it from its
    `tasks.options` entry (a terminal folder added through options brings its own verifier
    timeout); nothing is built to find out. Options its model refuses state no budget here:
    the family refuses them itself when the run builds it."""
    spec = FAMILIES.spec(family_name)
    try:
        checked = spec.validate_options(options, f"tasks.options.{family_name}")
    except ValueError:
        return None
    return spec.reward_budget_s(checked)
