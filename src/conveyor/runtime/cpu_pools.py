"""Named thread pools for the blocking CPU and disk work of the rollout stages.

Workspace copies and removals, task templates and code-index builds (init), and the grader's
copies, patches and diffs (reward) used to share `asyncio.to_thread`'s default pool with
everything else in the process (engine clients, the trainer's steps), a pool of unstated size
(`min(32, cpus + 4)`). Here each stage's work has its own pool, sized from the stage's width
(`dispatch.p_init`, `dispatch.p_reward`) by `configure_cpu_pools`, so a burst of grading cannot
queue set-ups behind it and the concurrency a config asks for is the concurrency it gets. Their
threads are named `conveyor-init_N` and `conveyor-reward_N`.

Pools are per process: a Ray runtime actor uses the default sizes.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, ParamSpec, TypeVar, get_args

P = ParamSpec("P")
T = TypeVar("T")

CpuPool = Literal["init", "reward"]
POOLS: tuple[CpuPool, ...] = get_args(CpuPool)

# What `asyncio.to_thread` gave this work before it had pools of its own.
DEFAULT_SIZE = min(32, (os.cpu_count() or 1) + 4)

_lock = threading.Lock()
_sizes: dict[CpuPool, int] = dict.fromkeys(POOLS, DEFAULT_SIZE)
_executors: dict[CpuPool, ThreadPoolExecutor] = {}


def configure_cpu_pools(*, init: int, reward: int) -> None:
    """Size the pools (`dispatch.p_init`, `dispatch.p_reward`); called by the composition root.

    Work already running finishes on the old threads; new work goes to pools of the new sizes.
    """
    sizes: dict[CpuPool, int] = {"init": init, "reward": reward}
    for pool, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"the {pool} CPU pool needs at least one thread, got {size!r}")
    with _lock:
        for pool, size in sizes.items():
            if _sizes[pool] == size:
                continue
            _sizes[pool] = size
            old = _executors.pop(pool, None)
            if old is not None:
                old.shutdown(wait=False)


def pool_size(pool: CpuPool) -> int:
    """How many threads `pool` runs work on."""
    return _sizes[_known(pool)]


def _executor(pool: CpuPool) -> ThreadPoolExecutor:
    with _lock:
        executor = _executors.get(pool)
        if executor is None:
            executor = ThreadPoolExecutor(_sizes[pool], thread_name_prefix=f"conveyor-{pool}")
            _executors[pool] = executor
        return executor


async def run_in_pool(pool: CpuPool, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` on a thread of `pool`, awaited (context variables carried over, as
    `asyncio.to_thread` does)."""
    executor = _executor(_known(pool))
    context = contextvars.copy_context()
    call = functools.partial(context.run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(executor, call)


def _known(pool: str) -> CpuPool:
    if pool not in POOLS:
        raise ValueError(f"unknown CPU pool {pool!r}; known: {', '.join(POOLS)}")
    return pool  # type: ignore[return-value]
