"""The composition root: config -> model folder -> tokenizer -> engine -> stages -> dispatcher.

Every command (`eval`, `train`, `bench dispatch --workload real`, and the bridge and gateway to
come) builds its parts here and nowhere else, so a new kind of engine, runtime, executor or task
family is wired once: each is looked up by name in `conveyor.registry`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.app.run_log import attach
from conveyor.config import ConveyorConfig, SamplingConfig, TrainerConfig
from conveyor.types import Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from conveyor.agent.chat_client import ChatClient
    from conveyor.config.sections import SideModelConfig
    from conveyor.dispatch.base import Dispatcher, EngineProbe
    from conveyor.dispatch.ray_cluster import RayCluster
    from conveyor.dispatch.stages import RolloutStages
    from conveyor.engines.base import SamplingClient
    from conveyor.registry import BackendSpec
    from conveyor.runtime.starts import RuntimeStarts
    from conveyor.tasks.family import FamilyServices, TaskFamily
    from conveyor.trainer.backend import TrainingBackend


def refuse_incomparable(config: ConveyorConfig, families: dict[str, TaskFamily]) -> None:
    """A family with a `config_problems(config)` lists what in the run's config makes its
    number incomparable with the published one: each is printed as one NOT COMPARABLE line;
    in benchmark mode (its options' `benchmark`) the run is refused (`ValueError` naming
    each) unless its options allow them (`allow_incomparable`)."""
    import sys

    for name, family in families.items():
        problems = getattr(family, "config_problems", None)
        found: list[str] = problems(config) if callable(problems) else []
        if not found:
            continue
        options = getattr(family, "options", None)
        if not getattr(options, "benchmark", False) or getattr(
            options, "allow_incomparable", False
        ):
            for problem in found:
                print(
                    f"{name}: NOT COMPARABLE with the published benchmark: {problem}",
                    file=sys.stderr,
                )
            continue
        raise ValueError(
            f"{name} runs in benchmark mode, and this config makes its number incomparable: "
            + "; ".join(found)
            + f" (tasks.options.{name}.allow_incomparable: true runs it anyway, marked so)"
        )


class Composition:
    """Builds the parts of one run from its config; each part is built on first use.

    The model folder, tokenizer and engine are built once and shared by every stage set and
    dispatcher made here; `close()` stops the engine. With `cluster.address` set, the run is a
    Ray driver (`start_cluster`): runtimes and, with `trainer.backend: ray_fsdp`, the trainer
    are placed on the cluster, and `close()` ends the Ray session with all its actors.
    """

    def __init__(self, config: ConveyorConfig) -> None:
        self.config = _with_backend_sampler(config)
        self._model_dir: Path | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._engine: SamplingClient | None = None
        self._families: dict[str, TaskFamily] | None = None
        self._chat: dict[str, ChatClient] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self._starts: RuntimeStarts | None = None
        self._cluster: RayCluster | None = None
        from conveyor.runtime.cpu_pools import configure_cpu_pools

        # CPU-stage work (workspace copies, grading, index builds) gets threads sized by the
        # stage pools it serves, not the default pool shared with everything else.
        configure_cpu_pools(init=config.dispatch.p_init, reward=config.dispatch.p_reward)

    @property
    def families(self) -> dict[str, TaskFamily]:
        """One instance of each configured family, built with the `runtime` settings (a family
        refuses here, at start, a runtime kind it cannot use)."""
        if self._families is None:
            from conveyor.tasks.family import build_families

            families = build_families(
                self.config.tasks.families, self.config.runtime, self.family_services
            )
            refuse_incomparable(self.config, families)
            self._families = families
        return self._families

    def family_services(self, name: str) -> FamilyServices:
        """Family `name`'s `tasks.options` entry and the clients of the models that play a
        part in its tasks (built only when the family first asks)."""
        from conveyor.tasks.family import FamilyServices

        tasks = self.config.tasks
        judge = tasks.judge_engine
        return FamilyServices(
            options=tasks.options.get(name, {}),
            user=lambda: self.chat_client("user", tasks.user_engine),
            judge=(lambda: self.chat_client("judge", judge)) if judge is not None else None,
        )

    def chat_client(self, role: str, side: SideModelConfig) -> ChatClient:
        """The chat client of a side model (`tasks.user_engine`, `tasks.judge_engine`), one per
        role: the run's own engine, or an engine of `side.engine` kind serving `side.model`
        (stopped by `close()`)."""
        client = self._chat.get(role)
        if client is not None:
            return client
        from conveyor.agent.chat_client import RenderedChatClient
        from conveyor.config.sections import RUN_ENGINE

        if side.engine == RUN_ENGINE:
            engine, tokenizer = self.engine, self.tokenizer
        else:
            from conveyor.engines.factory import build_engine, load_tokenizer
            from conveyor.models import resolve_model_path

            model_dir = resolve_model_path(side.model)
            engine_settings = self.config.engine.model_copy(
                update={
                    "kind": side.engine,
                    "base_url": side.base_url,
                    "base_urls": None,  # the run's replicas are not the side model's
                    "replicas": 1,
                    "server_args": [],
                    "served_model_name": side.served_model_name,
                }
            )
            model = self.config.model.model_copy(update={"path": side.model})
            config = self.config.model_copy(update={"engine": engine_settings, "model": model})
            engine = build_engine(config, model_dir)
            tokenizer = load_tokenizer(model_dir)
            self._closers.append(engine.close)
        client = RenderedChatClient(
            engine,
            tokenizer,  # type: ignore[arg-type]  # transformers' decode returns str | list[str]
            temperature=side.temperature,
            max_tokens=side.max_tokens,
            seed=side.seed,
            name=role,
        )
        self._chat[role] = client
        return client

    @property
    def runtime_starts(self) -> RuntimeStarts:
        """The run's runtime start limits and warm pools (`runtime.start_rate`,
        `max_concurrent_starts`, `warm_pool`), shared by every stage set made here; `close()`
        closes the warm runtimes. Its `report()` goes into the run's summary."""
        if self._starts is None:
            from conveyor.runtime.starts import RuntimeStarts

            self._starts = RuntimeStarts(self.config.runtime)
        return self._starts

    @property
    def model_dir(self) -> Path:
        """The model folder (`model.path`, or the embedded default); checked to exist."""
        if self._model_dir is None:
            from conveyor.models import resolve_model_path

            self._model_dir = resolve_model_path(self.config.model.path)
        return self._model_dir

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model folder's tokenizer (local files only)."""
        if self._tokenizer is None:
            from conveyor.engines.factory import load_tokenizer

            self._tokenizer = load_tokenizer(self.model_dir)
        return self._tokenizer

    @property
    def engine(self) -> SamplingClient:
        """The sampling engine `engine.kind` names, serving the model folder."""
        if self._engine is None:
            from conveyor.engines.factory import build_engine

            self._engine = build_engine(self.config, self.model_dir)
        return self._engine

    async def checked_engine(self) -> SamplingClient:
        """The engine, after a server behind it said it serves the model (a wrong URL or
        model name fails here, at start, not in the first rollout)."""
        from conveyor.engines.base import ServedModelCheck

        engine = self.engine
        if isinstance(engine, ServedModelCheck):
            await engine.check_served()
        return engine

    def start_cluster(self) -> RayCluster | None:
        """Join the Ray cluster `cluster.address` names (or start a local one), checked to
        offer what this run places there; None without `cluster.address`. Called first by
        `train` and `eval`, so a wrong address fails before the engine starts."""
        settings = self.config.cluster
        if settings.address is None:
            return None
        if self._cluster is None:
            from conveyor.dispatch.ray_cluster import connect

            workers = settings.trainer_workers if self.backend_spec.distributed else 0
            replicas = self.config.engine.replicas if settings.engine_resource else 0
            self._cluster = connect(settings, trainer_workers=workers, engine_replicas=replicas)
        return self._cluster

    def stages(
        self, sampling: SamplingConfig | None = None, engine: SamplingClient | None = None
    ) -> RolloutStages:
        """The agent's init/run/reward stages on `engine` (default: the run's engine).

        With `agent.external_command` the agent is that program, run per rollout against an
        in-process recording gateway (`conveyor.gateway.external`); `close()` stops it. On a
        cluster, init and reward run in a Ray actor per rollout on a sandbox node.
        """
        from conveyor.rollout import AgentStages

        client = engine if engine is not None else self.engine
        command = self.config.agent.external_command
        stages: RolloutStages
        if command:
            from conveyor.gateway.external import ExternalAgentStages

            external = ExternalAgentStages.from_config(
                self.config,
                command,
                client,
                self.tokenizer,
                sampling,
                families=self.families,
                starts=self.runtime_starts,
            )
            self._closers.append(external.close)
            stages = external
        else:
            stages = AgentStages.from_config(
                self.config,
                client,
                self.tokenizer,
                sampling,
                families=self.families,
                starts=self.runtime_starts,
            )
        cluster = self.start_cluster()
        return stages if cluster is None else cluster.place(stages)

    def dispatcher(
        self,
        stages: RolloutStages,
        *,
        engine: EngineProbe | None = None,
        strategy: str | None = None,
    ) -> Dispatcher:
        """The configured strategy (or `strategy`) driving `stages` on the configured executor."""
        from conveyor.dispatch.config import DispatchSettings
        from conveyor.dispatch.factory import make_dispatcher

        settings = DispatchSettings.from_config(self.config)
        if strategy is not None:
            # Validated, so the name becomes the strategy's {name, options} like a config's.
            settings = DispatchSettings.model_validate(
                {**settings.model_dump(), "strategy": strategy}
            )
        return make_dispatcher(settings, stages, engine=engine)

    def tasks(self, n: int | None = None, split: str | None = None) -> list[Task]:
        """`n` instances (default `tasks.num_tasks`) of every configured family from `split`
        (default `tasks.split`); eval-split instances from `tasks.eval_seed` when it is set."""
        spec = self.config.tasks
        split = spec.split if split is None else split
        seed = spec.eval_seed if split == "eval" and spec.eval_seed is not None else spec.task_seed
        out: list[Task] = []
        for family in self.families.values():
            out.extend(family.make_tasks(spec.num_tasks if n is None else n, seed, split))
        return out

    @property
    def backend_spec(self) -> BackendSpec:
        """The training backend `trainer.backend` names (`conveyor.registry.BACKENDS`)."""
        from conveyor.registry import BACKENDS

        return BACKENDS.spec(self.config.trainer.backend.name)

    def trainer(self, model_dir: Path, settings: TrainerConfig | None = None) -> TrainingBackend:
        """The configured training backend on `model_dir` with `settings` (default: the
        `trainer` section); one with workers of its own (`close()`) is stopped by `close()`."""
        self.start_cluster()
        backend = self.backend_spec.build(self.config, model_dir, settings or self.config.trainer)
        stop = getattr(backend, "close", None)
        if callable(stop):

            async def close_backend() -> None:
                if inspect.isawaitable(done := stop()):
                    await done

            self._closers.append(close_backend)
        return backend

    async def close(self) -> None:
        """Stop what the stages and trainers started (gateways, trainer workers, warm
        runtimes), then the engine, if one was started, then the Ray session `start_cluster`
        began."""
        try:
            for close in self._closers:
                await close()
            self._closers.clear()
        finally:
            try:
                if self._starts is not None:
                    await self._starts.close()
                if self._engine is not None:
                    await self._engine.close()
            finally:
                if self._cluster is not None:
                    self._cluster.shutdown()


def _with_backend_sampler(config: ConveyorConfig) -> ConveyorConfig:
    """`config`, with `engine.kind` set to the sampler its training backend brings (a
    `BackendSpec`'s `sampler`, e.g. Tinker's) when the config does not set `engine.kind`
    itself: changing `trainer.backend` is then the one change that moves a config."""
    if "kind" in config.engine.model_fields_set:
        return config
    from conveyor.registry import BACKENDS, ENGINES

    own = BACKENDS.spec(config.trainer.backend.name).sampler
    if not own:
        return config
    # The config's options were checked against the default kind's model; the sampler's own
    # model checks them again (an unset kind leaves them empty).
    options = ENGINES.spec(own).validate_options(config.engine.options, "engine.options")
    engine = config.engine.model_copy(update={"kind": own, "options": options})
    return config.model_copy(update={"engine": engine})


def check_run_dir(config: ConveyorConfig) -> None:
    """Refuse an explicit `run.dir` that already holds a run (before anything starts)."""
    if config.run.dir is not None:
        run_dir = Path(config.run.dir)
        if run_dir.exists() and any(run_dir.iterdir()):
            raise FileExistsError(
                f"run folder {run_dir} already holds a run; choose another run.dir"
            )


def make_run_dir(config: ConveyorConfig, kind: str) -> Path:
    """`run.dir`, or a fresh `runs/<kind>-<timestamp>`; an explicit folder must be new or empty.
    A command's library log (`conveyor.app.run_log`) goes into it from here on."""
    check_run_dir(config)
    if config.run.dir is not None:
        run_dir = Path(config.run.dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        attach(run_dir)
        return run_dir
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_dir = Path("runs") / f"{kind}-{stamp}"
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = Path("runs") / f"{kind}-{stamp}-{suffix}"
    run_dir.mkdir(parents=True)
    attach(run_dir)
    return run_dir
