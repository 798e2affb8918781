"""Serving a `Gateway` on a local port with uvicorn: embedded in a running event loop (tests,
`ExternalAgentStages`) or as the process's main job (`conveyor gateway`, stopped by SIGTERM)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Iterator

import uvicorn

from conveyor.gateway.app import make_app
from conveyor.gateway.service import Gateway

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves the process's signal handlers alone (its host owns them)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _SignalledServer(uvicorn.Server):
    """A uvicorn server stopped by SIGTERM/SIGINT that then returns normally (uvicorn re-raises
    the signal after its shutdown, which would kill the process before the gateway records its
    unfinished rollouts and the engine is closed)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


class GatewayServer:
    """One gateway on `127.0.0.1:port` (port 0 picks a free one)."""

    def __init__(self, gateway: Gateway, *, port: int = 0, host: str = "127.0.0.1") -> None:
        self.gateway = gateway
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._task: asyncio.Task[None] | None = None
        self._server: uvicorn.Server | None = None

    def _config(self) -> uvicorn.Config:
        return uvicorn.Config(
            make_app(self.gateway, self.url),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=5,
        )

    async def start(self) -> None:
        """Serve in the running loop until `stop`; returns once the port accepts requests."""
        self._server = _EmbeddedServer(self._config())
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the gateway server stopped while starting")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop serving, then record unfinished rollouts (`Gateway.shutdown`)."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
            self._server = self._task = None
        self._socket.close()
        await self.gateway.shutdown()

    async def serve_until_signal(self, on_ready: str | None = None) -> None:
        """Serve until SIGTERM/SIGINT (uvicorn's own handlers), then `Gateway.shutdown`."""
        server = _SignalledServer(self._config())
        task = asyncio.create_task(server.serve(sockets=[self._socket]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started and on_ready is not None:
            print(on_ready, flush=True)
        try:
            await task
        finally:
            self._socket.close()
            await self.gateway.shutdown()
