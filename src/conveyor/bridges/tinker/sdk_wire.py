"""What the Tinker SDK's own HTTP client would post, captured in memory instead of sent.

The SDK's async client (`tinker._client.AsyncTinker`, the client its `TrainingClient` posts
through) is given an httpx transport that records each request and answers with a request id,
so the bytes checked are the bytes the service would receive: serialized, and compressed when
the client config says so, by the SDK itself. Nothing leaves the process.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

FAKE_BASE_URL = "http://tinker.invalid"  # never resolved: the transport below answers


@dataclass(frozen=True)
class PostedRequest:
    """One HTTP request as the SDK made it (body decompressed when it was compressed)."""

    path: str
    content_type: str
    body: bytes


def capture_posts(send: Callable[[Any], Awaitable[Any]]) -> list[PostedRequest]:
    """Run `send(client)` against an SDK client whose transport records instead of sending."""
    import httpx
    from tinker._client import AsyncTinker

    posted: list[PostedRequest] = []

    def record(request: httpx.Request) -> httpx.Response:
        body = request.content
        if request.headers.get("content-encoding") == "zstd":
            import zstandard

            body = zstandard.ZstdDecompressor().decompress(body)
        posted.append(
            PostedRequest(request.url.path, request.headers.get("content-type", ""), body)
        )
        return httpx.Response(200, json={"request_id": f"captured-{len(posted)}"})

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(record)) as http:
            client = AsyncTinker(
                api_key="tml-offline-check", base_url=FAKE_BASE_URL, http_client=http
            )
            await send(client)

    with warnings.catch_warnings():
        # tinker 0.38.0 parses its own responses with pydantic's deprecated `construct`
        warnings.filterwarnings("ignore", message="The `construct` method is deprecated")
        asyncio.run(run())
    return posted


def posted_forward_backward(request: Any) -> PostedRequest:
    """The `/forward_backward` request the SDK posts for a `types.ForwardBackwardRequest`."""

    async def send(client: Any) -> None:
        await client.training.forward_backward(request=request)

    (posted,) = capture_posts(send)
    return posted


def posted_optim_step(adam_params: Any, model_id: str = "conveyor-check") -> PostedRequest:
    """The `/optim_step` request the SDK posts for `adam_params`."""
    from tinker.types.optim_step_request import OptimStepRequest

    async def send(client: Any) -> None:
        request = OptimStepRequest(optim_params=adam_params, model_id=model_id, seq_id=1)
        await client.training.optim_step(request=request)

    (posted,) = capture_posts(send)
    return posted
