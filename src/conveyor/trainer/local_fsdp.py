"""`trainer.fsdp: true` on the built-in backend, on one machine, without Ray.

`conveyor train` runs in one process, while FSDP needs one process per rank. When the built-in
backend is asked for FSDP and this process is not a rank of a process group (the usual case),
`BuiltinBackend.build` starts `trainer.fsdp_ranks` local rank processes (`LocalFsdpTrainer`):
each joins a gloo (CPU) or NCCL (one GPU each, `cuda:RANK`) group over 127.0.0.1 and holds one
`TorchTrainingEngine` rank, whose model loads shard by shard (`trainer/sharded_load.py`). The
driver talks to them over pipes exactly as `ray_fsdp`'s driver talks to its Ray actors: every
call goes to every rank at once (forwards and gathers are collective) and rank 0's answer comes
back; the RL loop, checkpoints and the fingerprint-checked weight sync use it unchanged. The
driver itself never joins the group, so an in-process vLLM keeps its own torch.distributed.

Weight sync: the ranks gather the full state dict, rank 0 serialises it (safetensors bytes)
through its pipe, and the driver loads it into its engine with `update_weights`.

Failure: a rank that raises sends its exception back, and one that dies closes its pipe; either
way the driver stops every rank (a rank left alone would wait in a collective) and raises.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import socket
import time
import traceback
from collections.abc import Iterator, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.config import TrainerConfig
from conveyor.engines.base import WeightFingerprint
from conveyor.trainer.backend import StepResult, TrainBatch
from conveyor.types import TrainingSample

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from torch import Tensor

# as `ray_fsdp`: how long a collective may wait for a peer (the driver stops every rank as
# soon as one fails, so this only bounds a rank whose peer hangs)
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
START_TIMEOUT_S = 600.0


class TrainerRankError(RuntimeError):
    """A local trainer rank failed or died; every rank was stopped."""


def fsdp_ranks(settings: TrainerConfig) -> int:
    """How many local ranks `trainer.fsdp` starts: `trainer.fsdp_ranks`, or one per visible
    CUDA GPU when the trainer's device is CUDA; a CPU trainer must set it."""
    if settings.fsdp_ranks is not None:
        return settings.fsdp_ranks
    import torch

    if settings.device != "cpu" and torch.cuda.is_available():
        return int(torch.cuda.device_count())
    raise ValueError(
        "trainer.fsdp: true on a CPU trainer needs trainer.fsdp_ranks (how many local "
        "processes to shard the model over)"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _portable(error: BaseException) -> BaseException:
    """`error` if it pickles, else a RuntimeError with its type, message and traceback."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        text = "".join(traceback.format_exception(error))
        return RuntimeError(f"{type(error).__name__}: {error}\n{text}")


class _Rank:
    """The body of one rank process: its engine and the calls the driver makes."""

    def __init__(self, engine: Any, rank: int) -> None:
        self.engine = engine
        self.rank = rank

    def step(self, batch: TrainBatch) -> StepResult:
        result: StepResult = self.engine.step(batch)
        return result

    def compute_logprobs(self, samples: Sequence[TrainingSample]) -> list[list[float]]:
        out: list[list[float]] = self.engine.compute_logprobs(samples)
        return out

    def export(self) -> bytes | None:
        """Rank 0: the full weights as safetensors bytes; the others take part in the gathers."""
        from safetensors.torch import save

        weights = {}
        for name, tensor in self.engine.export_weights():
            if self.rank == 0:
                weights[name] = tensor.detach().to("cpu", copy=True).contiguous()
        return save(weights) if self.rank == 0 else None

    def weight_fingerprint(
        self, like: WeightFingerprint, probe_ids: Sequence[int]
    ) -> WeightFingerprint:
        fingerprint: WeightFingerprint = self.engine.weight_fingerprint(like, probe_ids)
        return fingerprint

    def save(self, path: str) -> None:
        self.engine.save(Path(path))

    def load(self, path: str) -> int:
        self.engine.load(Path(path))
        version: int = self.engine.policy_version
        return version


def serve(
    rank: int,
    world_size: int,
    port: int,
    conn: Connection,
    model_dir: str,
    settings: TrainerConfig,
    temperature: float,
    total_steps: int | None,
    threads: int,
) -> None:
    """A rank process: join the group, load the model, then answer the driver's calls until
    it sends None or closes the pipe. Every answer is ("ok", value) or ("error", exception)."""
    import torch
    import torch.distributed as dist

    from conveyor.trainer.engine import TorchTrainingEngine, resolve_device

    torch.set_num_threads(max(threads, 1))
    try:
        device = resolve_device(settings.device)
        if device.type == "cuda":
            torch.cuda.set_device(rank)
            settings = settings.model_copy(update={"device": f"cuda:{rank}"})
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=COLLECTIVE_TIMEOUT,
        )
        engine = TorchTrainingEngine(
            model_dir,
            settings.model_copy(update={"fsdp": True}),
            temperature=temperature,
            total_steps=total_steps,
        )
        body = _Rank(engine, rank)
        conn.send(("ok", None))
    except BaseException as error:
        conn.send(("error", _portable(error)))
        return
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return
            if message is None:
                return
            name, args = message
            try:
                conn.send(("ok", getattr(body, name)(*args)))
            except BaseException as error:
                conn.send(("error", _portable(error)))
                return
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class LocalFsdpTrainer:
    """`TrainingBackend` (and `FingerprintedBackend`) whose ranks are local processes; see the
    module docstring. Build it with `start`; `close` stops the ranks."""

    def __init__(self, processes: list[BaseProcess], conns: list[Connection]) -> None:
        self.processes = processes
        self.conns = conns
        self._version = 0

    @classmethod
    def start(
        cls,
        model_dir: Path | str,
        settings: TrainerConfig,
        *,
        ranks: int | None = None,
        temperature: float = 1.0,
        total_steps: int | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> LocalFsdpTrainer:
        """Start `ranks` (default `fsdp_ranks(settings)`) rank processes and load the model on
        each; raises what a rank raised, or `TrainerRankError` past `start_timeout_s`."""
        n = fsdp_ranks(settings) if ranks is None else ranks
        if n < 1:
            raise ValueError(f"trainer.fsdp needs at least one rank, got {n}")
        threads = max(1, (os.cpu_count() or 1) // n)
        context = multiprocessing.get_context("spawn")
        port = _free_port()
        trainer = cls([], [])
        try:
            for rank in range(n):
                ours, theirs = context.Pipe()
                process = context.Process(
                    target=serve,
                    args=(
                        rank,
                        n,
                        port,
                        theirs,
                        str(model_dir),
                        settings,
                        temperature,
                        total_steps,
                        threads,
                    ),
                    name=f"conveyor-fsdp-rank{rank}",
                    daemon=True,
                )
                process.start()
                theirs.close()
                trainer.processes.append(process)
                trainer.conns.append(ours)
            trainer._answers(time.monotonic() + start_timeout_s)
        except BaseException:
            trainer.close()
            raise
        return trainer

    # -- the TrainingBackend protocol ------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """Updates made so far (rank 0's count)."""
        return self._version

    def step(self, batch: TrainBatch) -> StepResult:
        """One update on every rank from the same batch; rank 0's metrics."""
        result: StepResult = self._call("step", batch)
        self._version = result.policy_version
        return result

    def compute_logprobs(self, samples: Sequence[TrainingSample]) -> list[list[float]]:
        """Rank 0's logprobs (every rank computes them: the forwards are collective)."""
        rows: list[list[float]] = self._call("compute_logprobs", list(samples))
        return rows

    def export_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The full weights rank 0 gathered, on this process's CPU."""
        from safetensors.torch import load

        weights = load(self._call("export"))
        yield from weights.items()

    async def sync_to(self, engine: Any, *, step: int = 0) -> None:
        """Gather the full weights here, then load them into `engine` (a `WeightReceiver`)
        under this trainer's policy version."""
        from conveyor.trainer.faults import killing_midway

        weights = await asyncio.to_thread(lambda: dict(self.export_weights()))
        await engine.update_weights(killing_midway(iter(weights.items()), step), self._version)

    def weight_fingerprint(
        self, like: WeightFingerprint, probe_ids: Sequence[int]
    ) -> WeightFingerprint:
        """Rank 0's fingerprint of the trainer's weights."""
        fingerprint: WeightFingerprint = self._call("weight_fingerprint", like, list(probe_ids))
        return fingerprint

    def save(self, path: Path) -> None:
        """Every rank saves into `path` (rank 0 writes the files)."""
        self._call("save", str(path))

    def load(self, path: Path) -> None:
        """Every rank restores from `path`."""
        self._version = self._call("load", str(path))

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every rank (asked first, then terminated); idempotent."""
        processes, conns = self.processes, self.conns
        self.processes, self.conns = [], []
        for conn in conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 10.0
        for process in processes:
            process.join(max(deadline - time.monotonic(), 0.0))
            if process.is_alive():
                process.terminate()
                process.join(5.0)
            if process.is_alive():
                process.kill()
                process.join()
        for conn in conns:
            conn.close()

    def _call(self, name: str, *args: Any) -> Any:
        """Send one call to every rank; rank 0's answer."""
        if not self.conns:
            raise TrainerRankError("the trainer's ranks were stopped")
        try:
            for conn in self.conns:
                conn.send((name, args))
        except (OSError, ValueError) as error:
            self.close()
            raise TrainerRankError(
                f"a trainer rank is gone ({error}); every rank was stopped"
            ) from error
        return self._answers(None)[0]

    def _answers(self, deadline: float | None) -> list[Any]:
        """One answer from every rank, in rank order. The first error or death stops every
        rank and raises (a rank's own exception where it sent one)."""
        answers: dict[int, Any] = {}
        ranks = {id(conn): rank for rank, conn in enumerate(self.conns)}
        deaths = {process.sentinel: rank for rank, process in enumerate(self.processes)}
        pending = list(self.conns)
        while pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready = wait([*pending, *deaths], timeout=left)
            if not ready:
                self.close()
                raise TrainerRankError(
                    f"trainer ranks {sorted(ranks[id(c)] for c in pending)} did not start "
                    "within the start timeout; every rank was stopped"
                )
            for item in ready:
                if isinstance(item, Connection) and item in pending:
                    rank = ranks[id(item)]
                    try:
                        status, value = item.recv()
                    except EOFError:
                        status, value = "died", None
                    pending.remove(item)
                    if status != "ok":
                        self._fail(rank, value)
                    answers[rank] = value
            for item in ready:
                if isinstance(item, int) and item in deaths:
                    rank = deaths.pop(item)
                    conn = self.conns[rank]
                    if conn in pending and not conn.poll():
                        self._fail(rank, None)
        return [answers[rank] for rank in range(len(self.conns))]

    def _fail(self, rank: int, error: BaseException | None) -> None:
        code = self.processes[rank].exitcode if rank < len(self.processes) else None
        self.close()
        if isinstance(error, BaseException):
            raise error
        raise TrainerRankError(
            f"trainer rank {rank} died (exit code {code}); every rank was stopped"
        )
