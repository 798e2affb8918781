"""A client for an OpenAI-compatible completions server (`vllm serve`, SGLang).

Token ids go in as the `prompt` array; ids come back through vLLM's `return_token_ids` (or, on
servers without it, `return_tokens_as_token_ids`, which writes each token as `token_id:N`), with
the sampled tokens' logprobs. Text is never re-tokenized.

Requests go through one `httpx.AsyncClient` per event loop, so every rollout's request is on the
wire at once (a thread per request would cap the engine's batch at the thread pool's size) and a
cancelled rollout cancels its request. Failures are `EngineError`s, and fast: a refused or reset
connection is noticed at once rather than at the request timeout. After such a connection
failure the client asks the server's `/models` until `reconnect_s` has passed. If the server
answers (it restarted, or it had closed an idle kept-alive connection), the request is sent
again: the lost generation is redone and the rollout goes on; should the retries fail too, it
is an `EngineError` (the dispatcher retries the rollout). If the server never answers, the engine
is down (`EngineDown`): this and every later request fail at once, and the dispatcher stops the
run with that message.

Each request is retried up to `max_retries` times, with exponential backoff and bounded jitter,
on a lost connection (once the server answers again), HTTP 429 and 5xx; a `Retry-After` header
sets the wait (at most `_MAX_WAIT_S`). `retries` counts them, `retry_counts` by cause. Other 4xx
answers (an unknown model, a bad request) are not retried: sending them again cannot help.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import secrets
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from conveyor.engines.base import EngineDown, EngineError, SampleRequest, SampleResult
from conveyor.types import StopReason

if TYPE_CHECKING:
    import httpx

# Seconds one `/models` probe may take while the client decides whether the engine is down.
_PROBE_TIMEOUT_S = 2.0
# Idle kept-alive connections are dropped after this, before servers close them (uvicorn: 5 s),
# so a request rarely goes out on a connection the server is closing.
_KEEPALIVE_EXPIRY_S = 2.0
# Longest single wait between two tries, whatever the backoff or a `Retry-After` asks for.
_MAX_WAIT_S = 30.0
# Answers worth sending again: the server is overloaded or failed on its side.
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class OpenAICompatibleClient:
    """`SamplingClient` over HTTP `/v1/completions`; the session id is sent as `user` (sticky).

    `timeout_s` bounds one request; `connect_timeout_s` a connection attempt;
    `max_connections` the requests on the wire at once (more wait for a connection, which is
    not a failure); `reconnect_s` how long a lost server may take to answer again before the
    engine counts as down; `probe_interval_s` the pause between those probes;
    `max_retries` the tries after the first on a lost connection, 429 or 5xx, waiting
    `retry_backoff_s` x 2^k (k = 0, 1, ...; x 1 to 1.5 jitter) between them.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 256,
        reconnect_s: float = 30.0,
        probe_interval_s: float = 1.0,
        max_retries: int = 3,
        retry_backoff_s: float = 0.5,
    ) -> None:
        for name, value in (
            ("timeout_s", timeout_s),
            ("connect_timeout_s", connect_timeout_s),
            ("max_connections", max_connections),
            ("probe_interval_s", probe_interval_s),
        ):
            if value <= 0:
                raise ValueError(f"OpenAICompatibleClient: {name} must be > 0, got {value}")
        for name, value in (
            ("reconnect_s", reconnect_s),
            ("max_retries", max_retries),
            ("retry_backoff_s", retry_backoff_s),
        ):
            if value < 0:
                raise ValueError(f"OpenAICompatibleClient: {name} must be >= 0, got {value}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = os.environ.get(api_key_env, "")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        self.reconnect_s = reconnect_s
        self.probe_interval_s = probe_interval_s
        self.down: EngineDown | None = None  # set once the engine is found down; never cleared
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.resends = 0  # requests sent again after their connection was lost
        self.retries = 0  # requests sent again, for any cause
        # per cause: "connection" or the HTTP status ("429", "503", ...)
        self.retry_counts: Counter[str] = Counter()
        self.retry_wait_s = 0.0  # seconds waited before retries, in all
        self._jitter = random.Random(0)  # seeded: a test run waits the same each time
        self._in_flight = 0
        self._version = 0
        # request ids unique across clients and runs (a retry keeps its request's id)
        self._client_tag = secrets.token_hex(3)
        self._request_ids = itertools.count()
        self._http: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None
        # One liveness check at a time: every request that lost its connection waits on it.
        self._check: asyncio.Task[bool] | None = None

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return self._in_flight

    @property
    def policy_version(self) -> int:
        """The server's weights are opaque to this client, which cannot replace them: the
        version it was built with (0)."""
        return self._version

    def payload(self, request: SampleRequest) -> dict[str, Any]:
        """The JSON body for one request."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(request.prompt_ids),
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "logprobs": 0,
            "echo": False,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "user": request.session_id or None,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        if request.stop_token_ids:
            body["stop_token_ids"] = list(request.stop_token_ids)
        return body

    async def sample(self, request: SampleRequest) -> SampleResult:
        """POST one completion request; a transport or server failure is an `EngineError`
        (`EngineDown` once the server stopped answering for `reconnect_s`)."""
        if self.down is not None:
            raise self.down
        self._in_flight += 1
        try:
            data = await self._post(self.payload(request), headers=self._tag(request))
        finally:
            self._in_flight -= 1
        return parse_completion(data, self._version)

    def _tag(self, request: SampleRequest) -> dict[str, str] | None:
        """`X-Request-Id: <client>.<n>.<session>`: vLLM names the request so in its log
        (`--enable-log-requests`), which ties every logged request to its rollout."""
        if not request.session_id:
            return None
        return {
            "X-Request-Id": f"{self._client_tag}.{next(self._request_ids)}.{request.session_id}"
        }

    def _client(self) -> httpx.AsyncClient:
        """The HTTP client of the running loop (a client is bound to the loop that made it)."""
        import httpx

        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop:
            headers = {"Content-Type": "application/json"}
            if self.api_key:
                headers["Authorization"] = f"Bearer {self.api_key}"
            self._http = httpx.AsyncClient(
                headers=headers,
                # No pool timeout: waiting for a free connection is queueing, not a failure.
                timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s, pool=None),
                limits=httpx.Limits(
                    max_connections=self.max_connections,
                    max_keepalive_connections=self.max_connections,
                    keepalive_expiry=_KEEPALIVE_EXPIRY_S,
                ),
                trust_env=False,  # a proxy from the environment must not sit before the engine
            )
            self._http_loop = loop
            self._check = None
        return self._http

    async def _post(
        self, body: dict[str, Any], url: str | None = None, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """POST `body` (to `/completions` unless `url` is given) with retries; the JSON answer."""
        response = await self._send(url or f"{self.base_url}/completions", body, headers)
        try:
            data = response.json()
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise EngineError(f"{self.base_url}: the answer is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise EngineError(f"{self.base_url}: the answer is not a JSON object: {data!r:.200}")
        return data

    async def _send(
        self, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> httpx.Response:
        """POST with the retry policy; an answer below 400 or an `EngineError`."""
        import httpx

        tries = 0
        while True:
            try:
                response = await self._client().post(url, json=body, headers=headers)
            except httpx.TimeoutException as exc:
                kind = "connecting" if isinstance(exc, httpx.ConnectTimeout) else "waiting"
                raise EngineError(f"{url}: timed out {kind} ({type(exc).__name__})") from exc
            except httpx.TransportError as exc:
                # Refused, reset or closed mid-answer: is the server still there at all?
                lost = f"{self.base_url}: connection failed ({type(exc).__name__}: {exc})"
                if not await self._alive():
                    raise self._mark_down(lost) from exc
                if tries >= self.max_retries:
                    raise EngineError(
                        f"{lost}; the server answers, but the request sent again failed too "
                        f"({tries} retries)"
                    ) from exc
                self.resends += 1
                # The liveness check already waited for the server: a closed idle connection
                # (the common case) is resent at once, later losses back off.
                tries = await self._retry("connection", tries, "0" if tries == 0 else None)
                continue
            if response.status_code < 400:
                return response
            detail = f"{url}: HTTP {response.status_code}: {response.text[:500]}"
            if response.status_code not in _RETRY_STATUSES:
                raise EngineError(detail)
            if tries >= self.max_retries:
                raise EngineError(f"{detail} (after {tries} retries)")
            tries = await self._retry(
                str(response.status_code), tries, response.headers.get("Retry-After")
            )

    def request_counters(self) -> dict[str, int]:
        """`retries` (any cause), `retries_<cause>` (a status code, or the connection error's
        class) and `resends` (sent again after a lost connection was found alive)."""
        counts = {"retries": self.retries, "resends": self.resends}
        counts.update({f"retries_{cause}": n for cause, n in sorted(self.retry_counts.items())})
        return counts

    async def _retry(self, cause: str, tries: int, retry_after: str | None) -> int:
        """Count one retry of `cause` and wait before it; the tries made so far."""
        self.retries += 1
        self.retry_counts[cause] += 1
        wait = self.retry_backoff_s * 2**tries * (1 + 0.5 * self._jitter.random())
        if retry_after is not None:
            try:
                wait = float(retry_after)  # an HTTP date is rare from engines: backoff then
            except ValueError:
                pass
        wait = min(max(wait, 0.0), _MAX_WAIT_S)
        self.retry_wait_s += wait
        await asyncio.sleep(wait)
        return tries + 1

    async def check_served(self) -> None:
        """At start: the server answers `/models` and lists `self.model`; otherwise an
        `EngineError` that says which of the two failed (and, for a wrong name, what it serves)."""
        import httpx

        url = f"{self.base_url}/models"
        try:
            response = await self._client().get(url, timeout=self.connect_timeout_s)
        except httpx.HTTPError as exc:
            raise EngineError(
                f"no OpenAI-compatible server answers at {self.base_url} ({type(exc).__name__}: "
                f"{exc}); start one there or fix engine.base_url"
            ) from exc
        if response.status_code >= 400:
            raise EngineError(f"{url} answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            served = [str(entry["id"]) for entry in response.json()["data"]]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise EngineError(
                f"{url} did not list models in the OpenAI format: {response.text[:200]}"
            ) from exc
        if self.model not in served:
            raise EngineError(
                f"the server at {self.base_url} serves {served}, not {self.model!r}; set "
                "engine.served_model_name to the name it serves"
            )

    async def _alive(self) -> bool:
        """Whether the server answers `/models` within `reconnect_s` (one check shared by all
        requests that fail meanwhile)."""
        if self._check is None or self._check.done():
            self._check = asyncio.get_running_loop().create_task(self._probe_until_alive())
        # Shielded: a cancelled rollout must not cancel the check others wait on.
        return await asyncio.shield(self._check)

    async def _probe_until_alive(self) -> bool:
        import httpx

        deadline = time.monotonic() + self.reconnect_s
        while True:
            try:
                response = await self._client().get(
                    f"{self.base_url}/models", timeout=_PROBE_TIMEOUT_S
                )
                if response.status_code < 500:
                    return True
            except httpx.HTTPError:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(self.probe_interval_s, left))

    def _mark_down(self, lost: str) -> EngineDown:
        if self.down is None:
            self.down = EngineDown(
                f"{lost}; the engine did not answer for {self.reconnect_s:g}s, so it is down"
            )
        return self.down

    async def close(self) -> None:
        """Close the connections of the current loop's client; idempotent."""
        http, self._http, self._http_loop = self._http, None, None
        if http is not None and not http.is_closed:
            try:
                await http.aclose()
            except RuntimeError:  # made on a loop that is gone: nothing left to close there
                pass


def parse_completion(data: dict[str, Any], version: int = 0) -> SampleResult:
    """Token ids, logprobs and finish reason from a completions response."""
    try:
        choice = data["choices"][0]
        logprobs = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            tokens = logprobs.get("tokens") or []
            if not all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
                raise EngineError(
                    "the server returned no token ids; start vLLM with token-id support "
                    "(return_token_ids / --return-tokens-as-token-ids)"
                )
            ids = [int(t.split(":", 1)[1]) for t in tokens]
        values = [float(v) if v is not None else 0.0 for v in logprobs.get("token_logprobs") or []]
        if len(values) != len(ids):
            raise EngineError(f"server returned {len(ids)} ids but {len(values)} logprobs")
        reason = choice.get("finish_reason")
        finish = StopReason(reason) if reason in ("stop", "length") else StopReason.ABORT
        return SampleResult(
            token_ids=[int(i) for i in ids],
            logprobs=values,
            finish_reason=finish,
            policy_version=version,
        )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EngineError(f"malformed completions response: {exc}") from exc
