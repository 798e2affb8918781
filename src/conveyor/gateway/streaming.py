"""A chat completion sent as OpenAI's stream: `chat.completion.chunk` events over SSE.

The gateway samples a whole reply (the engine returns a completion, its ids and logprobs, and
the turn is recorded exactly as for `stream: false`), then sends it as OpenAI streams one:

1. a first chunk with `delta: {"role": "assistant", "content": ""}`,
2. the content in one `delta: {"content": ...}` (when there is any),
3. per tool call, a chunk opening it (`index`, `id`, `type`, `function.name`, empty
   `arguments`) and one with its `function.arguments`,
4. a last chunk with an empty delta and the `finish_reason`,
5. with `stream_options.include_usage`, a chunk with no choices and the `usage` (every chunk
   before it then carries `"usage": null`, as OpenAI's do),
6. `data: [DONE]`.

So a client that streams (an agent framework's default) gets the same message, finish reason
and usage that it would have got whole; the SDKs' accumulators rebuild it from these chunks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def completion_chunks(answer: dict[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects that stream the whole completion `answer` (its
    choices one after another, each chunk naming its choice's `index`)."""
    base = {
        "id": answer["id"],
        "object": "chat.completion.chunk",
        "created": answer["created"],
        "model": answer["model"],
        "system_fingerprint": None,
    }
    chunks: list[dict[str, Any]] = []
    for choice in answer["choices"]:
        chunks += _choice_chunks(base, choice, include_usage)
    if include_usage:
        chunks.append({**base, "choices": [], "usage": answer["usage"]})
    return chunks


def _choice_chunks(
    base: dict[str, Any], choice: dict[str, Any], include_usage: bool
) -> list[dict[str, Any]]:
    message = choice["message"]

    def chunk(
        delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        entry = {
            "index": choice["index"],
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        out: dict[str, Any] = {**base, "choices": [entry]}
        if include_usage:
            out["usage"] = None
        return out

    # the choice's logprobs go with the content they score (with the last chunk if none)
    logprobs = choice.get("logprobs")
    chunks = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        chunks.append(chunk({"content": message["content"]}, logprobs=logprobs))
        logprobs = None
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        opening = {
            "index": index,
            "id": call["id"],
            "type": call["type"],
            "function": {"name": function["name"], "arguments": ""},
        }
        arguments = {"index": index, "function": {"arguments": function["arguments"]}}
        chunks += [chunk({"tool_calls": [opening]}), chunk({"tool_calls": [arguments]})]
    chunks.append(chunk({}, choice["finish_reason"], logprobs))
    return chunks


def sse_events(chunks: list[dict[str, Any]]) -> Iterator[bytes]:
    """The server-sent events of a stream: one `data:` event per chunk, then `[DONE]`."""
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"
