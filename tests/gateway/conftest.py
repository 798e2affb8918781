"""Gateway fixtures: a real gateway served on a real port, over the real tokenizer and an engine.

The server runs in a thread with its own event loop, so a test may drive it with the blocking
`openai` client as an outside agent would.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from conveyor.agent.chat import renderer_factory
from conveyor.config import AgentConfig, ConveyorConfig, HintsConfig, SamplingConfig
from conveyor.engines.base import SamplingClient
from conveyor.gateway.server import GatewayServer
from conveyor.gateway.service import Gateway
from conveyor.tasks.family import build_families
from conveyor.types import Task

AGENT = AgentConfig(max_turns=6, max_completion_tokens=48, hints=HintsConfig(enabled=False))
GREEDY = SamplingConfig(temperature=0.0)


def make_gateway(
    client: SamplingClient,
    tokenizer: Any,
    *,
    agent: AgentConfig = AGENT,
    tasks: list[Task] | None = None,
    **kwargs: Any,
) -> Gateway:
    """A gateway over `client` rendering as the default config does, with filenav + arithmetic."""
    config = ConveyorConfig()
    return Gateway(
        client,
        renderer_factory(config.model, tokenizer),
        agent,
        GREEDY,
        families=build_families(["filenav", "arithmetic"]),
        tasks={t.id: t for t in tasks or []},
        **kwargs,
    )


@contextmanager
def served(gateway: Gateway) -> Iterator[str]:
    """Serve `gateway` on a free port in a background thread; yields its URL."""
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def target() -> None:
        async def main() -> None:
            server = GatewayServer(gateway)
            await server.start()
            holder["server"], holder["loop"], holder["stop"] = (
                server,
                asyncio.get_running_loop(),
                asyncio.Event(),
            )
            ready.set()
            await holder["stop"].wait()
            await server.stop()

        asyncio.run(main())

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    assert ready.wait(60), "gateway did not start"
    try:
        yield holder["server"].url
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(30)


@pytest.fixture
def make_gw(tokenizer: Any) -> Callable[..., Gateway]:
    """`make_gw(client, **kwargs)`: `make_gateway` on the real SmolLM2 tokenizer."""

    def make(client: SamplingClient, **kwargs: Any) -> Gateway:
        return make_gateway(client, tokenizer, **kwargs)

    return make


@pytest.fixture
def serve() -> Callable[[Gateway], Any]:
    """`with serve(gateway) as url:` the gateway on a free port."""
    return served
