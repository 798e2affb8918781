"""`conveyor gateway`: serve the recording gateway over the configured engine until SIGTERM.

The gateway sits below the `app` layer, so it cannot import the composition root. It builds its
parts through `GatewayParts`, which `conveyor.app.compose.Composition` satisfies as it is: the
CLI registers the command with `register(app, compose=Composition)`; without it (as in
`python -m conveyor.gateway`) `FactoryParts` builds them with the same registry factories the
composition root calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import typer

if TYPE_CHECKING:
    from conveyor.config import ConveyorConfig
    from conveyor.engines.base import SamplingClient
    from conveyor.tasks.family import TaskFamily
    from conveyor.types import Task

READY = "gateway ready {url}"


class GatewayParts(Protocol):
    """What the gateway needs from a composition root."""

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer."""
        ...

    @property
    def families(self) -> dict[str, TaskFamily]:
        """The configured task families."""
        ...

    async def checked_engine(self) -> SamplingClient:
        """The engine, checked at start."""
        ...

    def tasks(self, n: int | None = None, split: str | None = None) -> list[Task]:
        """The configured task instances."""
        ...

    async def close(self) -> None:
        """Stop the engine."""
        ...


class FactoryParts:
    """`GatewayParts` from the registry factories (model folder, tokenizer, engine, families)."""

    def __init__(self, config: ConveyorConfig) -> None:
        from conveyor.engines.factory import load_tokenizer
        from conveyor.models import resolve_model_path
        from conveyor.tasks.family import build_families, options_services

        self.config = config
        self.model_dir = resolve_model_path(config.model.path)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.families = build_families(
            config.tasks.families, config.runtime, options_services(config.tasks.options)
        )
        self._engine: SamplingClient | None = None

    async def checked_engine(self) -> SamplingClient:
        """The configured engine, after a server behind it said it serves the model."""
        from conveyor.engines.base import ServedModelCheck
        from conveyor.engines.factory import build_engine

        if self._engine is None:
            self._engine = build_engine(self.config, self.model_dir)
        if isinstance(self._engine, ServedModelCheck):
            await self._engine.check_served()
        return self._engine

    def tasks(self, n: int | None = None, split: str | None = None) -> list[Task]:
        """`tasks.num_tasks` instances of every family from `tasks.split`."""
        spec = self.config.tasks
        return [
            task
            for family in self.families.values()
            for task in family.make_tasks(
                spec.num_tasks if n is None else n, spec.task_seed, split or spec.split
            )
        ]

    async def close(self) -> None:
        """Stop the engine, if one was started."""
        if self._engine is not None:
            await self._engine.close()


def register(
    app: typer.Typer, compose: Callable[[ConveyorConfig], GatewayParts] | None = None
) -> None:
    """Add the `gateway` command to a typer app; `compose` builds the parts from the config
    (pass `conveyor.app.compose.Composition`; default `FactoryParts`)."""

    @app.command("gateway")
    def gateway_command(
        config: Annotated[Path, typer.Option("--config", help="Run config (YAML).")],
        port: Annotated[
            int, typer.Option("--port", help="Port on 127.0.0.1 (0: a free one).")
        ] = 8000,
        run_dir: Annotated[
            Path | None,
            typer.Option(
                "--run-dir",
                help="Where finished rollouts are appended (trajectories.jsonl); default "
                "run.dir, else runs/gateway-<time>.",
            ),
        ] = None,
        overrides: Annotated[
            list[str] | None,
            typer.Option("--set", help="Override a config value: --set agent.max_turns=8."),
        ] = None,
    ) -> None:
        """Serve OpenAI chat completions over the configured engine, one base URL per rollout
        (http://127.0.0.1:PORT/rollouts/ID/v1), recording every turn; stops on SIGTERM."""
        from conveyor.config import ConfigError, load_config

        try:
            resolved = load_config(config, overrides or [])
        except ConfigError as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code=2) from None
        parts = (compose or FactoryParts)(resolved.config)
        asyncio.run(serve(resolved.config, parts, port, run_dir))


async def serve(
    config: ConveyorConfig, parts: GatewayParts, port: int, run_dir: Path | None
) -> None:
    """Serve a gateway over `parts` on `port` until SIGTERM; the engine is closed after."""
    from conveyor.gateway.server import GatewayServer
    from conveyor.gateway.service import Gateway

    gateway: Gateway | None = None
    try:
        engine = await parts.checked_engine()
        gateway = Gateway.from_config(
            config,
            engine,
            parts.tokenizer,
            families=parts.families,
            tasks={task.id: task for task in parts.tasks()},
            run_dir=run_dir or default_run_dir(config),
        )
        server = GatewayServer(gateway, port=port)
        await server.serve_until_signal(on_ready=READY.format(url=server.url))
    finally:
        try:
            if gateway is not None:
                await gateway.close()  # the warm runtimes of its start limits
        finally:
            await parts.close()


def default_run_dir(config: ConveyorConfig) -> Path:
    """`run.dir`, else a fresh `runs/gateway-<time>` (the gateway appends to its file)."""
    if config.run.dir is not None:
        return Path(config.run.dir)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")
    return Path("runs") / f"gateway-{stamp}"
