"""Requests on the wire at once and wall time: the HTTP engine client before and after issue 14.

before: the old client, reconstructed here only (it is not an engine any more): every request a
    blocking `urllib` POST in `asyncio.to_thread`, so the default executor's size
    (min(32, cores + 4): 6 on 2 cores) capped the requests in flight.
after: `OpenAICompatibleClient` (one pooled `httpx.AsyncClient`).

Against a *fake slow server* (default: a stdlib server that holds each completion `--delay-s`
and counts the requests it holds at once) or a real server (`--url`, `--model`: the client-side
count of requests sent and not answered is reported then). One JSON line per client.

    python scripts/bench_http_client.py --requests 32 --delay-s 1
    python scripts/bench_http_client.py --url http://127.0.0.1:8000/v1 --model M --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from conveyor.engines.base import SampleRequest
from conveyor.engines.openai_http import OpenAICompatibleClient, parse_completion

_ANSWER = {
    "choices": [
        {"token_ids": [5, 6], "finish_reason": "stop", "logprobs": {"token_logprobs": [-1, -2]}}
    ]
}


class SlowFakeServer:
    """Holds every completion `delay_s`, then answers; `peak` is the most held at once."""

    def __init__(self, delay_s: float) -> None:
        self.now = 0
        self.peak = 0
        lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    owner.now += 1
                    owner.peak = max(owner.peak, owner.now)
                time.sleep(delay_s)
                with lock:
                    owner.now -= 1
                data = json.dumps(_ANSWER).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            request_queue_size = 256

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


class ThreadedUrllibClient:
    """The pre-issue-14 client, for this measurement only."""

    def __init__(self, base_url: str, model: str) -> None:
        self.shape = OpenAICompatibleClient(base_url, model)  # only for its request body
        self.in_flight = 0
        self.peak = 0

    async def sample(self, request: SampleRequest) -> Any:
        body = self.shape.payload(request)
        return parse_completion(await asyncio.to_thread(self._post, body))

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        self.in_flight += 1  # counted in the worker thread: requests actually being sent
        self.peak = max(self.peak, self.in_flight)
        try:
            req = urllib.request.Request(
                f"{self.shape.base_url}/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=600) as response:
                return dict(json.loads(response.read()))
        finally:
            self.in_flight -= 1


async def measure(client: Any, n: int, max_tokens: int) -> dict[str, Any]:
    """Send `n` requests at once; wall time and the most requests the client had in flight
    (the old one counts in its worker threads: requests actually being sent)."""
    peak = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, client.in_flight)
            await asyncio.sleep(0.005)

    requests = [
        SampleRequest(prompt_ids=[1, 2, 3], max_tokens=max_tokens, temperature=1.0, seed=i)
        for i in range(n)
    ]
    watcher = asyncio.create_task(watch())
    started = time.perf_counter()
    await asyncio.gather(*(client.sample(r) for r in requests))
    wall = time.perf_counter() - started
    done.set()
    await watcher
    if isinstance(client, OpenAICompatibleClient):
        await client.close()
    else:
        peak = max(peak, client.peak)
    return {"wall_s": round(wall, 3), "client_in_flight_peak": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--delay-s", type=float, default=1.0, help="fake server: hold per request")
    parser.add_argument("--url", default=None, help="a real server's base URL (…/v1)")
    parser.add_argument("--model", default="m")
    parser.add_argument("--max-tokens", type=int, default=2)
    args = parser.parse_args()
    fake = None if args.url else SlowFakeServer(args.delay_s)
    url = args.url or fake.url  # type: ignore[union-attr]
    for name, client in (
        ("before: to_thread + urllib", ThreadedUrllibClient(url, args.model)),
        ("after: httpx pool", OpenAICompatibleClient(url, args.model)),
    ):
        if fake is not None:
            fake.peak = 0
        result = asyncio.run(measure(client, args.requests, args.max_tokens))
        if fake is not None:
            result["server_held_peak"] = fake.peak
        line = {"client": name, "requests": args.requests, "cores": os.cpu_count(), **result}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
