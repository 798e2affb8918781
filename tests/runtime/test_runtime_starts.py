"""Start storms (`runtime.start_rate`, `start_burst`, `max_concurrent_starts`, `warm_pool`):
starts spaced by the token bucket, warm runtimes as fresh as new ones and never reused, and
nothing left behind after a run ends, crashes or is cancelled. Real bubblewrap sandboxes of the
math family (the executor's sandbox over an empty workspace), driven by the real dispatcher
from a config."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

import pytest

from conveyor.app.compose import Composition
from conveyor.config import ConfigError, ConveyorConfig, RuntimeConfig, load_config
from conveyor.dispatch.config import DispatchSettings
from conveyor.dispatch.factory import make_dispatcher
from conveyor.dispatch.telemetry import Telemetry
from conveyor.runtime.selection import started
from conveyor.runtime.simulated import SimulatedRuntime
from conveyor.runtime.starts import RECENT_STARTS, RuntimeStarts, StartCounters
from conveyor.tasks.executor import executor_available
from conveyor.types import Task, ToolCall, Trajectory
from processes import children_of

AVAILABLE, WHY = executor_available(RuntimeConfig(kind="bubblewrap"))
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"no bubblewrap sandbox here: {WHY}")

# Float slack on recorded times (the bucket only ever makes a start later, never earlier).
EPS_S = 0.02

# What one rollout's `python` call shows of its runtime: the workspace and /tmp as it got them.
PROBE = (
    "import os\n"
    "print('ws', sorted(os.listdir('.')), 'tmp', sorted(os.listdir('/tmp')))\n"
    "open('mark', 'w').write('x')\n"
    "open('/tmp/mark', 'w').write('x')\n"
)
FRESH = "ws ['.cells'] tmp []"


def _config(*overrides: str) -> ConveyorConfig:
    return load_config(
        None,
        [
            "tasks.families=[math]",
            "runtime.kind=bubblewrap",
            "dispatch.p_run=2",
            "dispatch.max_parallel=2",
            "dispatch.max_live_runtimes=2",
            "agent.max_turns=3",
            *overrides,
        ],
    ).config


def _bucket_holds(times: Iterable[float], rate: float, burst: int) -> None:
    """In every window [t_i, t_j]: at most burst + rate * (t_j - t_i) starts."""
    times = sorted(times)
    for i in range(len(times)):
        for j in range(i, len(times)):
            allowed = burst + rate * (times[j] - times[i] + EPS_S)
            assert j - i + 1 <= allowed, (i, j, times[j] - times[i], times)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("conveyor-"))


def _children() -> list[str]:
    """Processes whose parent is this one (a sandbox command left running would be one) that
    were not there when the test began (`_children_before`): in a parallel worker an earlier
    file may have left one (seen once in CI, the same pid in every test of this file)."""
    return [str(pid) for pid in children_of(os.getpid()) if str(pid) not in _BEFORE]


_BEFORE: set[str] = set()


@pytest.fixture(autouse=True)
def _children_before() -> None:
    _BEFORE.clear()
    _BEFORE.update(_children())


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Workspaces and sandbox /tmp folders of this test go here, so leftovers are ours."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


async def _probe_run(
    parts: Composition,
    tasks: list[Task],
    *,
    stop_after: int | None = None,
    telemetry: Telemetry | None = None,
) -> list[Trajectory]:
    """Rollouts whose policy runs PROBE then finishes, through the configured dispatcher;
    `stop_after`: the consumer crashes after that many records. Closes `parts` at the end."""
    from conveyor.trainer.sft import OracleEngine

    steps = [
        ToolCall(name="python", arguments={"code": PROBE}),
        ToolCall(name="finish", arguments={"answer": "0"}),
    ]
    tokenizer = parts.tokenizer
    engine = OracleEngine(
        {task.id: steps for task in tasks},
        lambda text: tokenizer.encode(text, add_special_tokens=False),
        tokenizer.eos_token_id,
        parts.config.model.tool_format,
    )
    settings = DispatchSettings.from_config(parts.config)
    stages = parts.stages(engine=engine)
    dispatcher = make_dispatcher(settings, stages, engine=engine, telemetry=telemetry)
    out: list[Trajectory] = []
    try:
        async for trajectory in dispatcher.rollouts(tasks, 1):
            out.append(trajectory)
            if stop_after is not None and len(out) >= stop_after:
                raise RuntimeError("the run crashed")
    finally:
        await parts.close()
    return out


def test_bad_start_settings_are_clear_config_errors() -> None:
    for override, fragment in [
        ("runtime.start_rate=0", "runtime.start_rate must be a number > 0 of starts per second"),
        ("runtime.start_rate=-2", "got -2.0; use null for no rate limit"),
        ("runtime.start_burst=0", "runtime.start_burst must be >= 1, got 0"),
        ("runtime.max_concurrent_starts=-1", "runtime.max_concurrent_starts must be >= 1"),
        ("runtime.warm_pool=-1", "runtime.warm_pool must be >= 0 (0 = off), got -1"),
        ("runtime.warm_pool=1.5", "runtime.warm_pool"),
        (
            "runtime.warm_pool=2 dispatch.executor=ray",
            "runtime.warm_pool (2) needs dispatch.executor 'asyncio', not 'ray'",
        ),
    ]:
        with pytest.raises(ConfigError, match="runtime") as caught:
            load_config(None, override.split())
        assert fragment in str(caught.value), str(caught.value)
    unlimited = load_config(None, ["runtime.start_rate=null", "runtime.warm_pool=4"]).config
    assert unlimited.runtime.start_rate is None and unlimited.runtime.warm_pool == 4
    defaults = RuntimeConfig()
    assert (defaults.start_rate, defaults.start_burst, defaults.warm_pool) == (32.0, 64, 0)


def test_every_start_in_a_run_waits_for_the_bucket_and_the_bound() -> None:
    """`started()` inside a run's `active()` scope: 30 simultaneous starts of a runtime whose
    start takes 20 ms, at 40/s with a burst of 5 and 3 in flight at most."""
    in_flight, peak = 0, 0

    class SlowStart(SimulatedRuntime):
        async def start(self) -> None:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.02)
            in_flight -= 1
            await super().start()

    starts = RuntimeStarts(RuntimeConfig(start_rate=40.0, start_burst=5, max_concurrent_starts=3))

    async def one() -> None:
        with starts.active():
            runtime = await started(SlowStart({}))
        assert runtime.alive()
        await runtime.close()

    async def storm() -> None:
        await asyncio.gather(*(one() for _ in range(30)))
        # outside a run nothing waits
        await (await started(SlowStart({}))).close()

    asyncio.run(storm())
    counters = starts.counters
    assert counters.starts == 30 and len(counters.start_times) == 30
    _bucket_holds(counters.start_times, 40.0, 5)
    assert peak == 3 and counters.slot_waits > 0 and counters.rate_waits > 0
    assert starts.report()["peak_starts_1s"] == _peak_in_window(list(counters.start_times), 1.0)
    assert starts.report()["peak_starts_1s"] <= 5 + 40


def _peak_in_window(times: list[float], window_s: float) -> int:
    """The most of `times` within `window_s` of each other: the reference, by brute force."""
    return max((sum(0 <= u - t <= window_s for u in times) for t in times), default=0)


def test_the_one_second_peak_counts_every_start_while_only_recent_times_are_kept() -> None:
    counters = StartCounters()
    burst = [100.0, 100.5, 101.0]  # three within one second (inclusive)
    for t in [0.0, 0.5, 1.6, 1.7, *burst]:
        counters.record_start(t)
    assert counters.peak_starts_1s == 3
    # a long run: spaced starts push the burst out of the kept times, not out of the peak
    for i in range(RECENT_STARTS + 5):
        counters.record_start(200.0 + 2.0 * i)
    assert len(counters.start_times) == RECENT_STARTS
    assert counters.start_times[0] > burst[-1]
    assert counters.peak_starts_1s == 3


@pytest.mark.slow
@needs_sandbox
def test_an_eval_spreads_its_sandbox_starts_and_reports_them(
    tmp_path: Path, model_dir: Path, private_tmp: Path
) -> None:
    """`conveyor eval` (in process) of 10 math tasks on bubblewrap at 4 starts/s, burst 2:
    the summary counts the starts and their waits, and no second held more than 2 + 4."""
    from conveyor.app.evaluate import run_eval

    resolved = load_config(
        None,
        [
            "engine.kind=simulated",
            "tasks.families=[math]",
            "tasks.num_tasks=10",
            "tasks.group_size=1",
            "runtime.kind=bubblewrap",
            "runtime.start_rate=4",
            "runtime.start_burst=2",
            "agent.max_turns=1",
            "agent.max_completion_tokens=8",
            f"run.dir={tmp_path / 'run'}",
        ],
    )
    run_dir = asyncio.run(run_eval(resolved, show_progress=False))
    summary = json.loads((run_dir / "summary.json").read_text())
    starts = summary["runtime_starts"]
    assert summary["overall"]["rollouts"] == 10
    assert "infra_error" not in summary["overall"]["statuses"]
    assert starts["starts"] == 10 and starts["failures"] == 0
    # 10 inits at once, 2 tokens: most waited (all 8 but where a stalled loop let tokens pile
    # up), and no second let more than burst + rate through (without the limit: all 10)
    assert starts["rate_waits"] >= 1 and starts["rate_wait_s"] > 0
    assert starts["peak_starts_1s"] <= 2 + 4
    assert starts["warm_hits"] == starts["warm_misses"] == 0  # no pool configured
    assert _leftovers(private_tmp) == []


@pytest.mark.slow
@needs_sandbox
def test_warm_runtimes_are_fresh_never_reused_and_closed(
    model_dir: Path, private_tmp: Path
) -> None:
    """warm_pool 2, rate 10/s burst 1: every rollout takes a sandbox of the pool (a ready one, a
    hit, or one the pool was starting, a join: the first request finds the pool empty), whatever the
    machine's speed; each rollout's workspace and /tmp are empty when its code first looks (so
    a warm one is as new as a fresh one, and no rollout sees another's files); starts keep to
    the bucket; after close no workspace, sandbox /tmp or process is left."""
    config = _config(
        "runtime.warm_pool=2",
        "runtime.start_rate=10",
        "runtime.start_burst=1",
        "tasks.num_tasks=8",
    )
    parts = Composition(config)
    tasks = parts.tasks(8, "eval")
    telemetry = Telemetry()
    trajectories = asyncio.run(_probe_run(parts, tasks, telemetry=telemetry))

    assert len(trajectories) == 8
    seen = [
        message["content"]
        for t in trajectories
        for message in t.messages
        if message.get("role") == "tool"
    ]
    assert len(seen) == 8 and all(FRESH in text for text in seen), seen
    report = parts.runtime_starts.report()
    assert report["warm_hits"] + report["warm_joins"] == 8 and report["warm_misses"] == 0, report
    assert report["warm_joins"] >= 1
    # every rollout's runtime plus the ones started for the pool, each started once
    assert report["starts"] >= 8 and report["failures"] == 0
    _bucket_holds(parts.runtime_starts.counters.start_times, 10.0, 1)
    assert report["warm_ready"] == 0  # the pool was emptied and closed
    # the dispatcher's telemetry carries the same counters (its last sample, at shutdown)
    recorded = telemetry.summary()["runtime_starts"]
    assert recorded["warm_hits"] + recorded["warm_joins"] == 8 and recorded["warm_misses"] == 0
    assert 8 <= recorded["starts"] <= report["starts"]  # a refill may end after the last sample
    assert _leftovers(private_tmp) == [] and _children() == []


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("how", ["crash", "cancel"])
def test_a_run_that_crashes_or_is_cancelled_leaves_no_sandbox_behind(
    how: str, model_dir: Path, private_tmp: Path
) -> None:
    """Mid-run, with rollouts in flight and warm sandboxes waiting in the pool: the consumer
    raises (crash) or the whole run task is cancelled; afterwards nothing of ours is left."""
    config = _config("runtime.warm_pool=3", "runtime.start_rate=null", "tasks.num_tasks=8")
    parts = Composition(config)
    tasks = parts.tasks(8, "eval")

    async def main() -> None:
        if how == "crash":
            with pytest.raises(RuntimeError, match="the run crashed"):
                await _probe_run(parts, tasks, stop_after=2)
            return
        run = asyncio.ensure_future(_probe_run(parts, tasks))
        while parts.runtime_starts.report()["warm_ready"] == 0 and not run.done():
            await asyncio.sleep(0.01)
        assert not run.done(), "the run ended before the pool filled"
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(main())
    report = parts.runtime_starts.report()
    assert report["starts"] >= 3 and report["warm_ready"] == 0
    assert _leftovers(private_tmp) == [] and _children() == []


def _take_twice(starts: RuntimeStarts, pooled: int, die: bool = False) -> tuple[bool, bool]:
    """A first request of a fresh pool, a wait until `pooled` runtimes are ready in it (then
    closed there when they `die`), a second request; everything closed after. Whether the
    second got a live runtime, and whether it was one of those that were ready."""

    async def main() -> tuple[bool, bool]:
        first = await starts.warm("blank", lambda: SimulatedRuntime({}))
        while starts.warm_ready() < pooled:
            await asyncio.sleep(0.01)
        ready = list(starts._pools["blank"].ready)
        for runtime in ready if die else []:
            await runtime.close()  # died in the pool
        second = await starts.warm("blank", lambda: SimulatedRuntime({}))
        outcome = (second.alive() and second is not first, any(second is r for r in ready))
        for runtime in (first, second):
            await runtime.close()
        await starts.close()
        return outcome

    return asyncio.run(main())


def test_a_dead_warm_runtime_is_discarded_never_handed_out() -> None:
    """A pooled runtime that died while waiting is closed and counted; the request gets a live
    one (the refill its take began: a join, as for the very first request)."""
    starts = RuntimeStarts(RuntimeConfig(start_rate=None, warm_pool=2))
    assert _take_twice(starts, pooled=2, die=True) == (True, False)
    counters = starts.counters
    # both requests found nothing ready (the first an empty pool, the second only dead ones)
    assert (counters.warm_discarded, counters.warm_hits, counters.warm_misses) == (2, 0, 0)
    assert counters.warm_joins == 2


class _Gated(SimulatedRuntime):
    """A runtime whose start waits for `release` (set by the test) and then fails when
    `fail` is set: every pool start is in flight until the test says."""

    made: ClassVar[list[_Gated]] = []
    release: ClassVar[asyncio.Event]
    fail: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__({})
        _Gated.made.append(self)

    async def start(self) -> None:
        await _Gated.release.wait()
        if _Gated.fail:
            raise RuntimeError("the recipe is broken")
        await super().start()


def _gated(fail: bool = False) -> None:
    _Gated.made = []
    _Gated.release = asyncio.Event()
    _Gated.fail = fail


def test_requests_wait_for_the_pools_starts_in_flight_rather_than_start_their_own() -> None:
    """warm_pool 2, three requests at once while every start is held: each waits for a pool
    start instead of adding its own, the pool keeps 2 unclaimed starts beside them, and once
    released all three are served (no miss) by distinct runtimes. The pool saved them no
    waiting (none was ready when asked): counted as hits, such a pool showed 100% hits; it
    shows 0 hits and 3 joins, in the summary's report and the telemetry's sample alike."""
    starts = RuntimeStarts(RuntimeConfig(start_rate=None, warm_pool=2))

    async def main() -> None:
        _gated()
        requests = [asyncio.ensure_future(starts.warm("blank", _Gated)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert len(_Gated.made) == 3 + 2 and not any(r.done() for r in requests)
        _Gated.release.set()
        got = await asyncio.gather(*requests)
        assert len({id(r) for r in got}) == 3 and all(r.alive() for r in got)
        while starts.warm_ready() < 2:
            await asyncio.sleep(0.01)
        assert len(_Gated.made) == 5  # nothing more: the pool is full again
        for runtime in got:
            await runtime.close()
        await starts.close()
        assert not any(r.alive() for r in _Gated.made)

    asyncio.run(main())
    counters = starts.counters
    assert (counters.warm_hits, counters.warm_joins, counters.warm_misses) == (0, 3, 0)
    assert starts.report()["warm_joins"] == starts.sample()["warm_joins"] == 3


def test_a_ready_idle_runtime_is_a_hit() -> None:
    """The first request of a pool joins its first start; once the refill is ready and idle,
    the next request takes that very runtime without waiting: a hit."""
    starts = RuntimeStarts(RuntimeConfig(start_rate=None, warm_pool=1))
    assert _take_twice(starts, pooled=1) == (True, True)
    counters = starts.counters
    assert (counters.warm_hits, counters.warm_joins, counters.warm_misses) == (1, 1, 0)
    assert starts.sample()["warm_hits"] == starts.report()["warm_hits"] == 1


def test_a_failed_pool_start_sends_its_waiting_request_to_a_fresh_start_that_reports_why() -> None:
    """The recipe is broken: the request that waited for the pool's start is a miss, starts
    its own runtime and gets that start's error; nothing is left alive or pending."""
    starts = RuntimeStarts(RuntimeConfig(start_rate=None, warm_pool=1))

    async def main() -> None:
        _gated(fail=True)
        _Gated.release.set()
        with pytest.raises(RuntimeError, match="the recipe is broken"):
            await starts.warm("blank", _Gated)
        await starts.close()
        assert not any(r.alive() for r in _Gated.made)

    asyncio.run(main())
    counters = starts.counters
    assert (counters.warm_hits, counters.warm_misses) == (0, 1)
    assert counters.failures >= 2  # the pool's start and the request's own


def test_a_request_cancelled_while_it_waits_leaves_its_runtime_to_the_pool() -> None:
    """A rollout cancelled while waiting for a pool start: the runtime, once started, goes to
    the pool (the next request takes it, nothing started for it) and close() closes the rest."""
    starts = RuntimeStarts(RuntimeConfig(start_rate=None, warm_pool=1))

    async def main() -> None:
        _gated()
        waiting = asyncio.ensure_future(starts.warm("blank", _Gated))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        _Gated.release.set()
        while starts.warm_ready() < 2:  # the cancelled request's start and the pool's own
            await asyncio.sleep(0.01)
        taken = await starts.warm("blank", _Gated)
        assert taken is _Gated.made[0] and taken.alive()
        await taken.close()
        await starts.close()
        assert not any(r.alive() for r in _Gated.made)

    asyncio.run(main())
    assert starts.counters.warm_hits == 1 and starts.warm_ready() == 0


def test_a_copy_for_another_process_keeps_the_limits_and_no_runtime() -> None:
    """The Ray executor pickles the stages into each actor: after use in this loop the starts
    still pickle, with the same limits and without this process's pooled runtimes."""
    import pickle

    starts = RuntimeStarts(RuntimeConfig(start_rate=5.0, max_concurrent_starts=2, warm_pool=1))

    async def use() -> None:
        runtime = await starts.warm("blank", lambda: SimulatedRuntime({}))
        await runtime.close()
        while starts.warm_ready() == 0:
            await asyncio.sleep(0.01)

    asyncio.run(use())
    copy = pickle.loads(pickle.dumps(starts))
    assert (copy.gate.rate, copy.gate.max_concurrent, copy.warm_ready()) == (5.0, 2, 0)
    assert asyncio.run(copy.start(SimulatedRuntime({}))).alive()
    asyncio.run(starts.close())
    assert starts.warm_ready() == 0 and starts.counters.warm_joins == 1


@needs_sandbox
def test_the_gateway_starts_its_rollouts_runtimes_under_the_same_limits(
    tokenizer: object, private_tmp: Path
) -> None:
    """`conveyor gateway`'s own runtime starts (POST /rollouts with a task): from the config's
    warm pool, and the pool closed with the gateway."""
    from conveyor.engines.simulated import SimulatedEngine
    from conveyor.gateway.service import Gateway

    config = _config("runtime.warm_pool=1", "runtime.start_rate=null")
    tasks = Composition(config).tasks(3, "eval")
    gateway = Gateway.from_config(config, SimulatedEngine(), tokenizer)

    async def main() -> None:
        for index, task in enumerate(tasks):
            await gateway.create(f"r{index}", task=task)
            while gateway.starts.warm_ready() < 1:
                await asyncio.sleep(0.01)
            await gateway.finish(f"r{index}", {"answer": "0"})
        await gateway.close()

    asyncio.run(main())
    report = gateway.starts.report()
    assert (report["warm_misses"], report["warm_hits"], report["warm_ready"]) == (0, 2, 0)
    assert report["warm_joins"] == 1  # the first request: later ones found one ready
    assert _leftovers(private_tmp) == [] and _children() == []
