"""`conveyor gateway`: serve the recording gateway over the configured engine until SIGTERM."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

READY = "gateway ready {url}"


def register(app: typer.Typer) -> None:
    """Add the `gateway` command to a typer app (the conveyor CLI, or a test's own)."""

    @app.command("gateway")
    def gateway_command(
        config: Annotated[Path, typer.Option("--config", help="Run config (YAML).")],
        port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1 (0: a free one).")] = 8000,
        run_dir: Annotated[
            Path | None,
            typer.Option("--run-dir", help="Where finished rollouts are appended "
                         "(trajectories.jsonl); default run.dir or runs/gateway-<time>."),
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
        asyncio.run(serve(resolved.config, port, run_dir))


async def serve(config: object, port: int, run_dir: Path | None) -> None:
    """Build engine, tokenizer and families through the composition root and serve."""
    from conveyor.app.compose import Composition, make_run_dir
    from conveyor.config import ConveyorConfig
    from conveyor.gateway.server import GatewayServer
    from conveyor.gateway.service import Gateway

    assert isinstance(config, ConveyorConfig)
    if run_dir is None:
        run_dir = make_run_dir(config, "gateway")
    composition = Composition(config)
    try:
        engine = await composition.checked_engine()
        tasks = {task.id: task for task in composition.tasks()}
        gateway = Gateway.from_config(
            config,
            engine,
            composition.tokenizer,
            families=composition.families,
            tasks=tasks,
            run_dir=run_dir,
        )
        server = GatewayServer(gateway, port=port)
        await server.serve_until_signal(on_ready=READY.format(url=server.url))
    finally:
        await composition.close()
