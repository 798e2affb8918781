"""Errors the gateway answers with, as OpenAI error bodies.

Every refusal is one `GatewayError`: the HTTP status and the body
`{"error": {"message", "type", "param", "code"}}` an OpenAI client parses, so an unmodified
agent sees a `BadRequestError` (400), `NotFoundError` (404), `ConflictError` (409) or
`InternalServerError` (5xx) with our message in it.

Every refusal also carries `x-should-retry: false` (the openai SDK obeys it before its status
rules, which retry 408, 409, 429 and 5xx): a rollout that ended, a refused request or an engine
failure that made the rollout an infra_error is not mended by sending the same request again,
and a retry would only be refused again. Only what a retry can fix says `true`.
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """A request the gateway refuses or could not serve."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry = retry

    def headers(self) -> dict[str, str]:
        """The response headers: whether a client should send the request again."""
        return {"x-should-retry": "true" if self.retry else "false"}

    def body(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> GatewayError:
    """A 400 for a request the client must change."""
    return GatewayError(400, message, param=param, code=code)


def not_found(message: str, *, code: str = "not_found") -> GatewayError:
    """A 404: no such rollout or route."""
    return GatewayError(404, message, type="not_found_error", code=code)


def conflict(message: str, *, code: str = "rollout_finished") -> GatewayError:
    """A 409: the request clashes with what exists (a rollout id taken, a second finish)."""
    return GatewayError(409, message, type="conflict_error", code=code)


def context_length_exceeded(tokens: int, limit: int, setting: str) -> GatewayError:
    """OpenAI's answer to a prompt over the context window, in OpenAI's words: litellm tells a
    context-window error by the phrase "this model's maximum context length is" (its
    `ExceptionCheckers.is_error_str_context_window_exceeded`) and raises
    `ContextWindowExceededError`, which agents end or compact on instead of retrying."""
    return GatewayError(
        400,
        f"This model's maximum context length is {limit} tokens. However, your messages "
        f"resulted in {tokens} tokens. Please reduce the length of the messages. "
        f"(gateway: {setting}={limit}; the rollout ended truncated)",
        param="messages",
        code="context_length_exceeded",
    )
