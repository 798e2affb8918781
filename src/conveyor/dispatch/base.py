"""What every strategy shares: the rollout lifecycle, fault isolation and the output stream.

A strategy decides only *when* each stage of each rollout runs (`schedule`). The lifecycle of one
rollout is fixed here, so every strategy has the same guarantees:

- init/reward failures and overruns, engine and runtime failures are infrastructure faults: the
  runtime is closed and the whole rollout starts again from init with a fresh runtime, up to
  `max_infra_retries` times, then it is recorded as `infra_error`; why each attempt was retried
  is logged and kept in the record (`_meta` messages of role `infra_retry`);
- a run-stage overrun is the policy's: status `timeout`, still scored by the reward stage;
- at most `max_live_runtimes` runtimes are alive at once, counted from init start to close end;
- every runtime is closed, on success, failure and cancellation, and every scheduled rollout is
  yielded exactly once;
- an engine that is down (`EngineDown`) stops the run: rollouts whose run stage has ended are
  still scored, every other one is recorded as `infra_error` (stop reason `engine_down`) at
  once, and after the last record `rollouts()` raises the engine's error, with the count.

The hooks a strategy uses are public and listed under "for strategies": `schedule` (what it
implements), `admit`, `step`, `advance`, `spawn`, `all_recorded`, `total`, and
`first_turn_slot` (for strategies that overlap the first turn with init, `first_turn.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from conveyor.dispatch.config import DispatchSettings
from conveyor.dispatch.first_turn import FirstTurns
from conveyor.dispatch.job import RolloutJob, Stage, cancel_and_wait, retry_records
from conveyor.dispatch.limiter import AdjustableLimit
from conveyor.dispatch.stages import FirstTurnStages, RolloutStages
from conveyor.dispatch.telemetry import Telemetry
from conveyor.engines.base import EngineDown
from conveyor.runtime.base import Runtime
from conveyor.runtime.starts import RuntimeStarts
from conveyor.types import EndReason, Status, Task, TaskDefect, Trajectory, TrajectoryGroup

__all__ = ["Dispatcher", "EngineProbe", "RolloutJob", "Stage"]

logger = logging.getLogger(__name__)

# Stage start/end stamps of one attempt; a retry drops them (queue waits keep accumulating).
_STAGE_TIMINGS = tuple(
    f"{stage}_{edge}" for stage in ("head", "init", "run", "reward") for edge in ("start", "end")
)


class EngineProbe(Protocol):
    """What the dispatcher may read from the engine: requests in flight (any `SamplingClient`)."""

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet answered."""
        ...


class _InfraFault(Exception):
    """An infrastructure failure of one stage of one attempt."""


@dataclass(slots=True)
class _Crash:
    error: BaseException


class Dispatcher:
    """Schedules the init, run and reward stages of many rollouts; subclasses pick the order.

    Use `rollouts()` to get trajectories as they finish or `groups()` for whole groups.
    `pause()` stops admission and the start of new run stages (and of first turns);
    `drain_run_stage()` then waits until no run stage and no first turn is in flight (around a
    weight update); `resume()` continues.
    """

    name: ClassVar[str] = "base"
    # Whether this strategy starts a rollout's first turn beside its init (`early_first_turn`).
    overlaps_first_turn: ClassVar[bool] = False

    def __init__(
        self,
        stages: RolloutStages,
        settings: DispatchSettings,
        *,
        engine: EngineProbe | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.stages = stages
        self.settings = settings
        self.engine = engine
        self.telemetry = telemetry
        self.live_runtimes = 0
        self.peak_live_runtimes = 0
        self.runs_in_flight = 0
        self.in_stage: dict[Stage, int] = dict.fromkeys(Stage, 0)
        self._live_limit = AdjustableLimit(settings.max_live_runtimes)
        self._first_turns = FirstTurns(
            stages
            if self.overlaps_first_turn
            and settings.early_first_turn
            and isinstance(stages, FirstTurnStages)
            else None,
            now=self.now,
            changed=self._check_run_idle,
        )
        self._open: dict[int, Runtime] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gate = asyncio.Event()
        self._gate.set()
        self._run_idle = asyncio.Event()
        self._run_idle.set()
        self._out: asyncio.Queue[Trajectory | _Crash] = asyncio.Queue()
        self._total = 0
        self._emitted = 0
        self._done = asyncio.Event()
        self._t0 = 0.0
        self._running = False
        self._stop: EngineDown | None = None  # why the run stops, once the engine is down
        self._stopped = 0  # rollouts recorded as infra_error because of `_stop`

    # -- public interface -------------------------------------------------------------------

    async def rollouts(
        self, tasks: Sequence[Task], samples_per_task: int
    ) -> AsyncGenerator[Trajectory, None]:
        """Run `samples_per_task` rollouts of every task; yield each trajectory as it finishes."""
        if self._running:
            raise RuntimeError("a dispatcher runs one batch of rollouts at a time")
        if samples_per_task < 1:
            raise ValueError(f"samples_per_task must be >= 1, got {samples_per_task}")
        self._running = True
        self._reset(len(tasks) * samples_per_task)
        if self._total == 0:
            self._running = False
            return
        scheduler = self.spawn(self.schedule(self._jobs(tasks, samples_per_task)))
        scheduler.add_done_callback(self._check_scheduler)
        if self.telemetry is not None:
            self.spawn(self._sample_forever(self.telemetry))
        try:
            while self._emitted < self._total or not self._out.empty():
                item = await self._out.get()
                if isinstance(item, _Crash):
                    if isinstance(item.error, TaskDefect):
                        raise item.error  # the task's own message, not a generic crash
                    raise RuntimeError("dispatcher failed") from item.error
                yield item
                if self._emitted >= self._total and self._out.empty():
                    break
            if self._stop is not None:
                raise EngineDown(
                    f"the run stopped: {self._stop}; {self._stopped} of {self._total} rollouts "
                    "are recorded as infra_error (stop reason engine_down)"
                ) from self._stop
        finally:
            await self._shutdown()
            self._running = False

    async def groups(
        self, tasks: Sequence[Task], samples_per_task: int
    ) -> AsyncGenerator[TrajectoryGroup, None]:
        """Like `rollouts`, but yield all samples of a task together as soon as the last ends."""
        pending: dict[str, list[Trajectory]] = {}
        stream = self.rollouts(tasks, samples_per_task)
        try:
            async for trajectory in stream:
                group = pending.setdefault(trajectory.task_id, [])
                group.append(trajectory)
                if len(group) == samples_per_task:
                    del pending[trajectory.task_id]
                    group.sort(key=lambda t: t.sample_index)
                    yield TrajectoryGroup(task_id=trajectory.task_id, trajectories=group)
        finally:
            await stream.aclose()

    def pause(self) -> None:
        """Stop admitting rollouts and starting run stages (in-flight work continues)."""
        self._gate.clear()

    def resume(self) -> None:
        """Undo `pause()`."""
        self._gate.set()

    async def drain_run_stage(self) -> None:
        """Wait until no run stage (nor first turn) is in flight; call after `pause()` (e.g. for
        a weight update)."""
        if self._gate.is_set():
            raise RuntimeError("drain_run_stage() needs pause() first, or it may never end")
        await self._run_idle.wait()

    def queue_depths(self) -> dict[str, float]:
        """Jobs waiting per stage hand-off queue (strategies with queues override this)."""
        return {}

    @property
    def first_turns(self) -> int:
        """Rollouts whose first turn has started and whose run stage has not (engine sessions
        too)."""
        return self._first_turns.waiting

    # -- for strategies ---------------------------------------------------------------------

    async def schedule(self, jobs: Iterator[RolloutJob]) -> None:
        """The strategy: drive every job to its record (with `admit`, then `step` or
        `advance`); return once all are recorded (`await self.all_recorded()`)."""
        raise NotImplementedError

    def first_turn_slot(self) -> Callable[[], None] | None:
        """A place for one first turn on the engine now, as the function that gives it back, or
        None (then the rollout's first turn waits for its run stage). Asked only by strategies
        that overlap first turns (`overlaps_first_turn`); by default there is always a place
        (the rollout's own slot bounds it). The pipeline bounds first turns with its run pool."""
        return lambda: None

    @property
    def total(self) -> int:
        """Rollouts in the batch being dispatched."""
        return self._total

    async def all_recorded(self) -> None:
        """Wait until every rollout of the batch has its record."""
        await self._done.wait()

    def now(self) -> float:
        """Seconds since this batch of rollouts started, on the running loop's clock."""
        return asyncio.get_running_loop().time() - self._t0

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start a task that the dispatcher owns: cancelled at shutdown, a crash is reported."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    async def admit(self, job: RolloutJob) -> None:
        """Admission point: waits while paused; stamps the job as admitted."""
        await self._gate.wait()
        job.ready_at = self.now()
        job.timings["admitted"] = job.ready_at

    async def advance(self, job: RolloutJob, until: Stage | None = None) -> None:
        """Step `job` until it is finished or its next stage is `until`."""
        while job.next_stage is not None and job.next_stage != until:
            job.next_stage = await self.step(job, job.next_stage)

    async def step(self, job: RolloutJob, stage: Stage) -> Stage | None:
        """Run one stage of one job with the shared lifecycle (timeouts, retries, records);
        return the next stage (`Stage.INIT` again for a retry, `None` once its record is out)."""
        if self._stop is not None and stage is not Stage.REWARD:
            # no engine to run it: recorded now rather than set up (or retried) in vain
            await self._close(job)
            self._emit_stopped(job)
            return None
        try:
            if stage is Stage.INIT:
                await self._init(job)
                return Stage.RUN
            if stage is Stage.RUN:
                await self._run(job)
                return Stage.REWARD
            await self._reward(job)
        except EngineDown as down:
            self._stop = self._stop or down
            await self._close(job)
            self._emit_stopped(job)
            return None
        except _InfraFault as fault:
            await self._close(job)
            if job.attempt >= self.settings.max_infra_retries:
                self._emit_infra_error(job, str(fault))
                return None
            logger.warning(
                "rollout %s/%d: attempt %d is retried: %s",
                job.task.id,
                job.sample_index,
                job.attempt,
                fault,
            )
            job.retry_reasons.append(str(fault))
            job.attempt += 1
            job.ready_at = self.now()
            # the record (and `auto`'s latencies) describe the attempt that counts: a stage end
            # left from the attempt before would pair with this attempt's start
            for key in _STAGE_TIMINGS:
                job.timings.pop(key, None)
            return Stage.INIT
        await self._close(job)
        self._emit_finished(job)
        return None

    # -- the stages -------------------------------------------------------------------------

    async def _init(self, job: RolloutJob) -> None:
        await self._live_limit.acquire()
        try:
            start = self.now()
            self._add_wait(job, "init_queue_wait", start - job.ready_at)
            self.live_runtimes += 1
            self.peak_live_runtimes = max(self.peak_live_runtimes, self.live_runtimes)
            job.timings["init_start"] = start
            self._start_head(job)
            timeout = asyncio.timeout(self.settings.init_timeout_s)
            self.in_stage[Stage.INIT] += 1
            try:
                async with timeout:
                    runtime = await self.stages.init(job.task, job.sample_index, job.attempt)
            except TimeoutError as error:
                raise _InfraFault(self._describe("init", error, timeout.expired())) from error
            except TaskDefect:
                raise
            except Exception as error:
                raise _InfraFault(self._describe("init", error, False)) from error
            finally:
                self.in_stage[Stage.INIT] -= 1
        except BaseException:
            self._first_turns.drop(job)
            self._release_live()
            raise
        self._open[id(runtime)] = runtime
        job.runtime = runtime
        job.ready_at = job.timings["init_end"] = self.now()

    async def _run(self, job: RolloutJob) -> None:
        await self._gate.wait()
        assert job.runtime is not None
        start = self.now()
        self._add_wait(job, "run_queue_wait", start - job.ready_at)
        job.timings["run_start"] = start
        self.runs_in_flight += 1
        self.in_stage[Stage.RUN] += 1
        self._run_idle.clear()
        timeout = asyncio.timeout(self.settings.run_timeout_s)
        try:
            async with timeout:
                trajectory = await self._run_stage(job, job.runtime)
        except TimeoutError as error:
            if not timeout.expired():
                raise _InfraFault(self._describe("run", error, False)) from error
            trajectory = Trajectory(
                task_id=job.task.id,
                sample_index=job.sample_index,
                status=Status.TIMEOUT,
                stop_reason=EndReason.RUN_TIMEOUT,
                error=f"run stage exceeded {self.settings.run_timeout_s:g}s",
            )
        except (TaskDefect, EngineDown):
            raise
        except Exception as error:
            raise _InfraFault(self._describe("run", error, False)) from error
        finally:
            self.runs_in_flight -= 1
            self.in_stage[Stage.RUN] -= 1
            self._check_run_idle()
        job.trajectory = trajectory
        job.ready_at = job.timings["run_end"] = self.now()

    async def _reward(self, job: RolloutJob) -> None:
        assert job.runtime is not None and job.trajectory is not None
        start = self.now()
        self._add_wait(job, "reward_queue_wait", start - job.ready_at)
        job.timings["reward_start"] = start
        timeout = asyncio.timeout(self.settings.reward_timeout_s)
        self.in_stage[Stage.REWARD] += 1
        try:
            async with timeout:
                job.trajectory = await self.stages.reward(job.task, job.trajectory, job.runtime)
        except TimeoutError as error:
            raise _InfraFault(self._describe("reward", error, timeout.expired())) from error
        except TaskDefect:
            raise
        except Exception as error:
            raise _InfraFault(self._describe("reward", error, False)) from error
        finally:
            self.in_stage[Stage.REWARD] -= 1
        job.ready_at = job.timings["reward_end"] = self.now()

    async def _run_stage(self, job: RolloutJob, runtime: Runtime) -> Trajectory:
        """The run stage's coroutine, continuing from the job's first turn if one was started."""
        continued = await self._first_turns.run(job, runtime)
        if continued is not None:
            return continued
        return await self.stages.run(job.task, job.sample_index, runtime)

    def _start_head(self, job: RolloutJob) -> None:
        """Start the job's first turn beside its init, if the strategy has a place for it on
        the engine (not while paused: no new engine work then)."""
        if self._gate.is_set() and self._first_turns.start(job, self.first_turn_slot):
            self._run_idle.clear()

    def _check_run_idle(self) -> None:
        if self.runs_in_flight == 0 and not self._first_turns.generating:
            self._run_idle.set()

    async def _close(self, job: RolloutJob) -> None:
        self._first_turns.drop(job)
        runtime, job.runtime = job.runtime, None
        if runtime is None:
            return
        try:
            await runtime.close()
        except asyncio.CancelledError:
            raise  # it stays in `_open`; shutdown closes it again (close is idempotent)
        except Exception:
            logger.warning("closing a runtime failed", exc_info=True)
        if self._open.pop(id(runtime), None) is not None:
            self._release_live()

    # -- records ----------------------------------------------------------------------------

    def _emit_finished(self, job: RolloutJob) -> None:
        assert job.trajectory is not None
        trajectory = job.trajectory
        job.timings["finished"] = self.now()
        self._emit(
            trajectory.model_copy(
                update={
                    "timings": {**trajectory.timings, **job.timings},
                    "counters": {**trajectory.counters, "infra_retries": job.attempt},
                    "messages": [*trajectory.messages, *retry_records(job.retry_reasons)],
                }
            ),
            job,
        )

    def _emit_infra_error(
        self,
        job: RolloutJob,
        error: str,
        stop_reason: EndReason = EndReason.INFRA_RETRIES_EXHAUSTED,
    ) -> None:
        job.timings["finished"] = self.now()
        record = Trajectory(
            task_id=job.task.id,
            sample_index=job.sample_index,
            status=Status.INFRA_ERROR,
            stop_reason=stop_reason,
            error=error,
            messages=retry_records(job.retry_reasons),
            timings=dict(job.timings),
            counters={"infra_retries": job.attempt},
        )
        self._emit(record, job)

    def _emit_stopped(self, job: RolloutJob) -> None:
        assert self._stop is not None
        self._stopped += 1
        self._emit_infra_error(job, str(self._stop), stop_reason=EndReason.ENGINE_DOWN)

    def _emit(self, trajectory: Trajectory, job: RolloutJob) -> None:
        job.trajectory = None
        self._emitted += 1
        if self.telemetry is not None:
            self.telemetry.record(trajectory)
        self._out.put_nowait(trajectory)
        if self._emitted >= self._total:
            self._done.set()

    # -- plumbing ---------------------------------------------------------------------------

    def _reset(self, total: int) -> None:
        self._t0 = asyncio.get_running_loop().time()
        self._total = total
        self._emitted = 0
        self._done = asyncio.Event()
        self._out = asyncio.Queue()
        self._stop, self._stopped = None, 0
        self.peak_live_runtimes = self.live_runtimes

    def _jobs(self, tasks: Sequence[Task], samples: int) -> Iterator[RolloutJob]:
        if self.settings.admission_order == "group_aware":
            order = ((t, s) for t in range(len(tasks)) for s in range(samples))
        else:
            order = ((t, s) for s in range(samples) for t in range(len(tasks)))
        for seq, (task_index, sample) in enumerate(order):
            yield RolloutJob(task=tasks[task_index], sample_index=sample, seq=seq)

    def _release_live(self) -> None:
        self.live_runtimes -= 1
        self._live_limit.release()

    @staticmethod
    def _add_wait(job: RolloutJob, key: str, wait: float) -> None:
        job.timings[key] = job.timings.get(key, 0.0) + max(0.0, wait)

    def _describe(self, stage: str, error: BaseException, expired: bool) -> str:
        if expired:
            limit = getattr(self.settings, f"{stage}_timeout_s")
            return f"{stage} stage exceeded {limit:g}s"
        return f"{stage} stage: {type(error).__name__}: {error}"

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._out.put_nowait(_Crash(task.exception()))  # type: ignore[arg-type]

    def _check_scheduler(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is not None or self._done.is_set():
            return
        missing = self._total - self._emitted
        self._out.put_nowait(
            _Crash(RuntimeError(f"strategy {self.name!r} ended with {missing} rollouts missing"))
        )

    async def _sample_forever(self, telemetry: Telemetry) -> None:
        interval = self.settings.telemetry_interval_s
        while True:
            telemetry.sample(self.now(), self._snapshot())
            await asyncio.sleep(interval)

    def _snapshot(self) -> dict[str, float]:
        values: dict[str, float] = {
            "live_runtimes": self.live_runtimes,
            "runs_in_flight": self.runs_in_flight,
            "finished": self._emitted,
            **self.queue_depths(),
        }
        if self.engine is not None:
            values["engine_in_flight"] = self.engine.in_flight
        starts = getattr(self.stages, "starts", None)
        if isinstance(starts, RuntimeStarts):
            # the stages' runtime start limits and warm pool (asyncio executor: same process)
            values.update({f"runtime_{key}": v for key, v in starts.sample().items()})
        return values

    async def _shutdown(self) -> None:
        """Cancel every task this dispatcher started and close every runtime still open."""
        if self.telemetry is not None:
            self.telemetry.sample(self.now(), self._snapshot())
        # a crash was already reported; a first turn's failure has nobody left to run it
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        await self._first_turns.cancel_all()
        for runtime in list(self._open.values()):
            try:
                await runtime.close()
            except Exception:
                logger.warning("closing a runtime at shutdown failed", exc_info=True)
            self._release_live()
        self._open.clear()
