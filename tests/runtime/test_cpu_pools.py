"""The named CPU pools: work runs on their threads, and each pool's width is the setting."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from conveyor.runtime import cpu_pools
from conveyor.runtime.cpu_pools import configure_cpu_pools, pool_size, run_in_pool


@pytest.fixture(autouse=True)
def _default_sizes() -> Iterator[None]:
    yield
    configure_cpu_pools(init=cpu_pools.DEFAULT_SIZE, reward=cpu_pools.DEFAULT_SIZE)


def test_work_runs_on_the_named_threads_of_its_pool() -> None:
    async def names() -> tuple[str, str]:
        here = threading.current_thread().name
        init = await run_in_pool("init", lambda: threading.current_thread().name)
        reward = await run_in_pool("reward", lambda: threading.current_thread().name)
        assert here not in (init, reward)
        return init, reward

    init, reward = asyncio.run(names())
    assert init.startswith("conveyor-init_") and reward.startswith("conveyor-reward_")


def _peak(pool: cpu_pools.CpuPool, jobs: int, width: int) -> tuple[int, set[str]]:
    """Run `jobs` blocking jobs that meet in groups of `width`: the peak of jobs running at
    once and the threads that ran them."""
    meet = threading.Barrier(width, timeout=60)
    lock = threading.Lock()
    running, peak, names = 0, 0, set()

    def job() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            names.add(threading.current_thread().name)
        meet.wait()  # a pool narrower than `width` never gets here: BrokenBarrierError
        with lock:
            running -= 1

    async def all_jobs() -> None:
        await asyncio.gather(*(run_in_pool(pool, job) for _ in range(jobs)))

    asyncio.run(all_jobs())
    return peak, names


@pytest.mark.parametrize(("init", "reward"), [(3, 2), (2, 4)])
def test_the_pool_width_follows_the_setting(init: int, reward: int) -> None:
    configure_cpu_pools(init=init, reward=reward)
    assert (pool_size("init"), pool_size("reward")) == (init, reward)
    # twice as many jobs as threads: never more at once than the width, every thread used
    peak, names = _peak("init", 2 * init, init)
    assert peak == init and len(names) == init
    peak, names = _peak("reward", 2 * reward, reward)
    assert peak == reward and len(names) == reward


def test_context_variables_reach_the_pool_thread() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def read() -> str:
        var.set("set in the task")
        return await run_in_pool("init", var.get)

    assert asyncio.run(read()) == "set in the task"


@pytest.mark.parametrize("size", [0, -1, True, 2.5])
def test_a_bad_size_is_refused(size: object) -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        configure_cpu_pools(init=size, reward=1)  # type: ignore[arg-type]


def test_an_unknown_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown CPU pool 'run'; known: init, reward"):
        asyncio.run(run_in_pool("run", print))  # type: ignore[arg-type]
