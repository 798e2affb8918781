"""Errors the gateway answers with, as OpenAI error bodies.

Every refusal is one `GatewayError`: the HTTP status and the body
`{"error": {"message", "type", "param", "code"}}` an OpenAI client parses, so an unmodified
agent sees a `BadRequestError` (400), `NotFoundError` (404), `ConflictError` (409) or
`InternalServerError` (5xx) with our message in it.
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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

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
    """A 409: the rollout can no longer take this request."""
    return GatewayError(409, message, type="conflict_error", code=code)
