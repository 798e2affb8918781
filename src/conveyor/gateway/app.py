"""The gateway's HTTP face: a Starlette app over a `Gateway` (routes in docs/gateway.md).

Every failure leaves as an OpenAI error body: a `GatewayError` with its status, a body that is
not JSON as a 400, an unknown route as a 404 and anything unexpected as a 500, so a client never
waits on a half-answered request.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from conveyor.gateway.chat_request import parse_chat_request
from conveyor.gateway.errors import GatewayError, bad_request
from conveyor.gateway.responses import response_events, sse_response_events
from conveyor.gateway.service import Gateway
from conveyor.gateway.streaming import completion_chunks, sse_events
from conveyor.types import Task

log = logging.getLogger(__name__)

# A whole conversation fits many times over; a larger body is refused before it is parsed.
MAX_BODY_BYTES = 32 * 1024 * 1024


def make_app(gateway: Gateway, base_url: str) -> Starlette:
    """The ASGI app; `base_url` (`http://127.0.0.1:PORT`) is what rollout URLs are built on."""

    def rollout_url(rollout_id: str) -> str:
        return f"{base_url}/rollouts/{rollout_id}"

    async def create(request: Request) -> Response:
        body = await _json(request, allow_empty=True) or {}
        if not isinstance(body, dict) or set(body) - {
            "rollout_id",
            "task_id",
            "task",
            "sample_index",
            "split_samples",
        }:
            raise bad_request(
                'the body must be an object with optional "rollout_id", "task_id", "task", '
                '"sample_index", "split_samples"'
            )
        task = None
        if body.get("task") is not None:
            try:
                task = Task.model_validate(body["task"])
            except ValidationError as exc:
                raise bad_request(f"'task' is not a Task: {exc}", param="task") from exc
        sample_index = body.get("sample_index", 0)
        if not isinstance(sample_index, int) or sample_index < 0:
            raise bad_request("sample_index must be a non-negative integer", param="sample_index")
        record = await gateway.create(
            body.get("rollout_id"),
            task=task,
            task_id=body.get("task_id"),
            sample_index=sample_index,
            split_samples=body.get("split_samples"),
        )
        rid = record.rollout_id
        return JSONResponse({"rollout_id": rid, "base_url": f"{rollout_url(rid)}/v1"})

    async def show(request: Request) -> Response:
        rid = request.path_params["rid"]
        trajectory = gateway.trajectory(rid)
        headers = {
            "x-conveyor-rollout-state": gateway.get(rid).state.value,
            "x-conveyor-splits": str(trajectory.counters.get("splits", 0)),
        }
        return Response(trajectory.to_json(), media_type="application/json", headers=headers)

    async def finish(request: Request) -> Response:
        trajectory = await gateway.finish(
            request.path_params["rid"], await _json(request, allow_empty=True)
        )
        return Response(trajectory.to_json(), media_type="application/json")

    async def task(request: Request) -> Response:
        return JSONResponse(gateway.task_info(request.path_params["rid"]))

    async def tool(request: Request) -> Response:
        rid, name = request.path_params["rid"], request.path_params["name"]
        return JSONResponse(await gateway.call_tool(rid, name, await _json(request)))

    async def named_tool(request: Request) -> Response:
        body = await _json(request)
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise bad_request('the body must be {"name": str, "arguments": {...}}')
        rid = request.path_params["rid"]
        return JSONResponse(await gateway.call_tool(rid, body["name"], body.get("arguments", {})))

    async def chat(request: Request) -> Response:
        asked = parse_chat_request(await _json(request))
        rid = request.path_params["rid"]
        answer = await gateway.chat(rid, asked)
        headers = gateway.split_headers(rid)
        if asked.stream:
            # sampled and recorded whole: an error is still a plain JSON answer, as OpenAI's
            # are before its stream starts
            chunks = completion_chunks(answer, include_usage=asked.include_usage)
            return StreamingResponse(
                sse_events(chunks), media_type="text/event-stream", headers=headers
            )
        return JSONResponse(answer, headers=headers)

    async def responses(request: Request) -> Response:
        body = await _json(request)
        rid = request.path_params["rid"]
        response = await gateway.respond(rid, body)
        headers = gateway.split_headers(rid)
        if isinstance(body, dict) and body.get("stream"):
            events = sse_response_events(response_events(response, body))
            return StreamingResponse(iter(events), media_type="text/event-stream", headers=headers)
        return JSONResponse(response, headers=headers)

    async def models(request: Request) -> Response:
        entry = {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "conveyor"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "rollouts": len(gateway.rollouts)})

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/rollouts", create, methods=["POST"]),
        Route("/rollouts/{rid}", show, methods=["GET"]),
        Route("/rollouts/{rid}/finish", finish, methods=["POST"]),
        Route("/rollouts/{rid}/task", task, methods=["GET"]),
        Route("/rollouts/{rid}/tools", named_tool, methods=["POST"]),
        Route("/rollouts/{rid}/tools/{name}", tool, methods=["POST"]),
        Route("/rollouts/{rid}/v1/chat/completions", chat, methods=["POST"]),
        Route("/rollouts/{rid}/v1/responses", responses, methods=["POST"]),
        Route("/rollouts/{rid}/v1/models", models, methods=["GET"]),
    ]
    handlers: dict[Any, Any] = {
        GatewayError: _gateway_error,
        HTTPException: _http_error,
        Exception: _unexpected,
    }
    return Starlette(routes=routes, exception_handlers=handlers)


async def _json(request: Request, *, allow_empty: bool = False) -> Any:
    declared = request.headers.get("content-length", "0")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise GatewayError(
            413, f"the request body is over {MAX_BODY_BYTES} bytes", code="body_too_large"
        )
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise GatewayError(
            413, f"the request body is over {MAX_BODY_BYTES} bytes", code="body_too_large"
        )
    if not raw.strip() and allow_empty:
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(
            f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from exc


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    error = GatewayError(
        exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", type=kind
    )
    return JSONResponse(error.body(), status_code=exc.status_code)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("gateway: unexpected error on %s %s", request.method, request.url.path)
    error = GatewayError(
        500,
        f"internal gateway error: {type(exc).__name__}: {exc}",
        type="server_error",
        code="internal_error",
    )
    return JSONResponse(error.body(), status_code=500)
