"""Sync against async RL where trainer and engine have devices of their own (simulated).

On two shared CPU cores, generation and training take turns on the same cores, so overlapping
them buys little (docs/algorithms.md has the measured numbers). Where the engine and the trainer
have their own GPUs, async pays; this models by how much, with the swe-sim workload
(`conveyor.sim.swe`, every engine parameter with its source) for generation and a trainer model
whose parameters are stated below.

Per step j, the generation time `gen_j` is the makespan of one step's rollouts (the workload's
`tasks` x `samples_per_task`, seed j) through the real pipeline dispatcher on the simulated
engine, in virtual time; the update time is the step's trained tokens (prompt, completions and
tool outputs of every trajectory) over the trainer's throughput, plus a weight sync. The
schedule is the one `RLLoop` runs (conveyor.trainer.loop): generation is sequential, and step j's
may start once step j-1's has ended and update j-1-ahead is done (ahead 0: sync, 1 and 2:
async with that staleness bound); update j starts when generation j and update j-1 are done.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

from conveyor.config import PartChoice
from conveyor.dispatch import DispatchSettings, make_dispatcher
from conveyor.sim.engine import SimEngine
from conveyor.sim.stages import SimEnvironment
from conveyor.sim.swe import SweSimWorkload
from conveyor.sim.virtual_loop import run_virtual


@dataclass(frozen=True)
class TrainerModel:
    """The trainer's time per step; every value with its source."""

    # derived: forward + backward = 6 FLOP per parameter per token, Qwen3-32B (the swe-sim model)
    flops_per_token: float = 6 * 32e9
    # SkyRL's SWE recipe trains on the same 4-GPU count it serves with (assumption: 4 H100)
    gpus: int = 4
    # derived: H100 SXM dense bf16
    gpu_flops: float = 989e12
    # assumption: FSDP2 training MFU on long sequences
    mfu: float = 0.4
    # assumption: 64 GB of bf16 weights gathered and sent to the engines at ~50 GB/s
    sync_s: float = 1.3

    def step_s(self, tokens: float) -> float:
        """Seconds of one update on `tokens` trained tokens, weight sync excluded."""
        return tokens * self.flops_per_token / (self.gpus * self.gpu_flops * self.mfu)


async def _generate_step(workload: SweSimWorkload, seed: int) -> tuple[float, float]:
    """(makespan, trained tokens) of one step's rollouts in virtual time."""
    engine = SimEngine(workload, occupancy_reference=40)
    engine.start()
    env = SimEnvironment(workload, seed, engine)
    settings = DispatchSettings(
        strategy=PartChoice(name="pipeline"),
        p_run=workload.max_live_runtimes,
        max_live_runtimes=workload.max_live_runtimes,
    )
    dispatcher = make_dispatcher(settings, env, engine=engine)
    loop = asyncio.get_running_loop()
    start = loop.time()
    tokens = 0.0
    async for trajectory in dispatcher.rollouts(env.tasks(), workload.samples_per_task):
        tokens += trajectory.metrics.get("context_tokens", 0.0)
    makespan = loop.time() - start
    await engine.close()
    return makespan, tokens


def schedule(gen: list[float], update: list[float], ahead: int) -> dict[str, float]:
    """The loop's schedule of generation and updates; wall time and overlap."""
    gen_end: list[float] = []
    upd_end: list[float] = []
    overlap = 0.0
    for j in range(len(gen)):
        start = gen_end[j - 1] if j else 0.0
        gate = j - 1 - ahead  # update index that must be done before generation j starts
        if gate >= 0:
            start = max(start, upd_end[gate])
        gen_end.append(start + gen[j])
        begin = max(gen_end[j], upd_end[j - 1] if j else 0.0)
        upd_end.append(begin + update[j])
    # training time during which some generation ran (separate devices: both busy)
    for j in range(len(gen)):
        u0 = upd_end[j] - update[j]
        for k in range(len(gen)):
            g0 = gen_end[k] - gen[k]
            overlap += max(0.0, min(upd_end[j], gen_end[k]) - max(u0, g0))
    return {
        "wall_s": upd_end[-1],
        "step_s": upd_end[-1] / len(gen),
        "train_overlapped_fraction": overlap / sum(update) if sum(update) else 0.0,
    }


def run_rl_async(
    steps: int = 8,
    workload: SweSimWorkload | None = None,
    trainer: TrainerModel | None = None,
    aheads: tuple[int, ...] = (0, 1, 2),
) -> dict[str, Any]:
    """The report of `conveyor bench rl-async`: per staleness bound, wall time per step and the
    speed-up over sync on the same simulated steps."""
    workload = workload or SweSimWorkload()
    trainer = trainer or TrainerModel()
    steps_data = [run_virtual(_generate_step(workload, seed)) for seed in range(steps)]
    gen = [g for g, _ in steps_data]
    update = [trainer.step_s(tokens) + trainer.sync_s for _, tokens in steps_data]
    modes = {}
    for ahead in aheads:
        name = "sync" if ahead == 0 else f"async_staleness_{ahead}"
        modes[name] = schedule(gen, update, ahead)
    base = modes.get("sync", next(iter(modes.values())))["wall_s"]
    for numbers in modes.values():
        numbers["speedup_over_sync"] = base / numbers["wall_s"]
    return {
        "steps": steps,
        "rollouts_per_step": workload.trajectories,
        "generation_s": {"mean": sum(gen) / steps, "min": min(gen), "max": max(gen)},
        "update_s": {"mean": sum(update) / steps, "min": min(update), "max": max(update)},
        "trainer": asdict(trainer),
        "modes": modes,
        "note": "simulated: separate devices for engine and trainer (swe-sim + TrainerModel)",
    }
