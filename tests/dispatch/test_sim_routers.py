"""Router policies of the simulated engine fleet, the recomputed-prefill counter, and the
`routers` block of `conveyor bench dispatch --replicas N` (issue 18, capacity planning)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from conveyor.bench.dispatch import run_bench, simulate
from conveyor.bench.routers import ROUTER_POLICIES, rotated_jobs
from conveyor.cli import app
from conveyor.sim.engine import SimEngine
from conveyor.sim.router import ROUTERS, SessionStickyRouter, make_router
from conveyor.sim.swe import SweSimWorkload
from conveyor.sim.virtual_loop import run_virtual

# multi-turn rollouts, KV ample (no eviction, no preemption): only routing can lose a prefix
MULTI_TURN = SweSimWorkload(
    tasks=4, samples_per_task=2, turns_min=6, turns_max=10, max_live_runtimes=8
)
PIPELINE = {"p_init": 4, "p_run": 8, "p_reward": 4}
# the CLI test's workload: small enough to tune the pipeline's grid in a few seconds
CLI_SET = ["samples_per_task=2", "turns_min=2", "turns_max=5", "max_live_runtimes=8"]


def _bench_cli(*extra: str) -> list[str]:
    args = ["bench", "dispatch", "--workload", "swe-sim", "--tasks", "3", "--seeds", "2"]
    args += ["--strategies", "pipeline", "--no-fresh", "--processes", "1"]
    for item in CLI_SET:
        args += ["--set", item]
    return args + list(extra)


def test_cli_replicas_json_has_the_routers_contract_and_keeps_the_strategies_block() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *_bench_cli("--replicas", "4", "--json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    routers = report["routers"]
    assert {"session_sticky", "round_robin", "random"} <= set(routers)
    for figures in routers.values():
        assert figures["makespan_s"] > 0
        assert figures["prefill_tokens_recomputed"] >= 0
        assert figures["runs"] == 2 and figures["runs_unaccounted"] == 0
    sticky, rr = routers["session_sticky"], routers["round_robin"]
    assert rr["prefill_tokens_recomputed"] > 10 * max(1.0, sticky["prefill_tokens_recomputed"])
    assert report["limits"]["engine_replicas"] == report["routers_setup"]["engine_replicas"] == 4
    # the routers ran the pipeline at the point its tuning chose
    assert report["routers_setup"]["knobs"] == report["strategies"]["pipeline"]["best_knobs"]
    # every repeat runs every policy, rotated: each policy leads one repeat's order once
    order = report["routers_setup"]["order"]
    n = len(routers)
    assert [order[i * n] for i in range(2)] == list(ROUTER_POLICIES[:2])
    # the strategies block is what the same run without --replicas reports (4 is the default)
    workload = SweSimWorkload.model_validate(
        {"tasks": 3, **dict(item.split("=") for item in CLI_SET)}
    )
    plain = run_bench(
        seeds=2, processes=1, strategies=("pipeline",), workload=workload, fresh=False
    )
    assert "routers" not in plain
    assert json.loads(json.dumps(plain["strategies"])) == report["strategies"]


def test_cli_replicas_sets_the_fleet_size_and_prints_the_routers_table() -> None:
    result = CliRunner().invoke(app, [*_bench_cli("--replicas", "2")])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    report = json.loads(lines[-1])
    assert report["limits"]["engine_replicas"] == 2
    assert report["routers_setup"]["engine_replicas"] == 2
    assert report["workload_overrides"] == CLI_SET
    table = [line for line in lines[:-1] if line.split()[:1] == ["round_robin"]]
    assert len(table) == 1 and f"{report['routers']['round_robin']['makespan_s']:.0f}" in table[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "0"], "--replicas"),
        (["--set", "no_such_field=1"], "no_such_field"),
        (["--set", "turns_max"], "field=value"),
        (["--set", "engine_replicas=two"], "engine_replicas"),
    ],
)
def test_cli_bad_sim_inputs_are_one_clear_error(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, [*_bench_cli(), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_replicas_is_refused_for_the_real_workload() -> None:
    result = CliRunner().invoke(app, ["bench", "dispatch", "--workload", "real", "--replicas", "2"])
    assert result.exit_code == 2
    assert "engine.replicas" in result.output


def test_sticky_recomputes_nothing_where_round_robin_and_random_recompute_the_history() -> None:
    runs = {
        name: simulate(MULTI_TURN, "pipeline", PIPELINE, 0, router=name)
        for name in ("session_sticky", "session_hash", "round_robin", "random")
    }
    for name in ("session_sticky", "session_hash"):
        assert runs[name]["prefill_tokens_recomputed"] == 0
    for name in ("round_robin", "random"):
        run = runs[name]
        assert run["preemptions"] == 0
        assert run["recomputed_by_cause"]["routing"] == run["prefill_tokens_recomputed"]
        # the history outweighs each turn's new tokens: most prefill is recomputation
        assert run["prefill_tokens_recomputed"] > 0.6 * run["prefill_tokens"]
        assert run["prefill_tokens"] - run["prefill_tokens_recomputed"] == pytest.approx(
            runs["session_sticky"]["prefill_tokens"], rel=0.01
        )
        assert run["statuses"] == runs["session_sticky"]["statuses"]


def test_with_one_replica_every_policy_is_the_same_run() -> None:
    one = MULTI_TURN.model_copy(update={"engine_replicas": 1})
    runs = [simulate(one, "pipeline", PIPELINE, 1, router=name) for name in ROUTERS]
    assert all(run == runs[0] for run in runs[1:])


def test_unknown_router_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown router 'sticky'.*session_sticky"):
        make_router("sticky")


@dataclass
class _Load:
    requests_in_flight: int
    kv_used: int


def test_sticky_router_places_new_sessions_least_loaded_then_keeps_them() -> None:
    router = SessionStickyRouter()
    loads = [_Load(3, 10), _Load(1, 900), _Load(1, 500), _Load(2, 0)]
    assert router.route("a", loads) == 2  # fewest in flight, then least KV
    loads[2].requests_in_flight = 9
    assert router.route("a", loads) == 2  # sticky, however loaded its replica is now
    assert router.route("b", loads) == 1


def _drive(workload: SweSimWorkload, router: str, script: list[tuple[str, int, int]]) -> SimEngine:
    """Requests run one after another (each session's turns in order) on a fresh engine."""

    async def main() -> SimEngine:
        engine = SimEngine(workload, occupancy_reference=1, router=router)
        engine.start()
        for session, context, completion in script:
            await engine.generate(session, context, completion)
        await engine.close()
        return engine

    return run_virtual(main())


TWO = SweSimWorkload(engine_replicas=2, kv_capacity_tokens=10_000)


def test_recomputed_prefill_counts_the_history_a_replica_lacks_by_cause() -> None:
    turns = [("s", 100, 10), ("s", 150, 10)]  # turn 2 = turn 1's 110 tokens + 40 new
    assert _drive(TWO, "session_sticky", turns).prefill_tokens_recomputed == 0
    moved = _drive(TWO, "round_robin", turns)
    assert moved.prefill_tokens_recomputed == 110
    assert moved.recomputed_by_cause == {"routing": 110, "eviction": 0, "preemption": 0}
    assert moved.prefill_tokens == 100 + 150
    # back on a replica that holds an older prefix: only what it lacks is recomputed
    back = _drive(TWO, "round_robin", [*turns, ("s", 200, 10)])
    assert back.prefill_tokens_recomputed == 110 + (160 - 110)
    # prefix caching off: the same replica recomputes the whole history (eviction)
    uncached = TWO.model_copy(update={"prefix_caching": False})
    assert _drive(uncached, "session_sticky", turns).recomputed_by_cause["eviction"] == 110


def test_recomputed_prefill_counts_eviction_and_preemption() -> None:
    one = SweSimWorkload(engine_replicas=1, kv_capacity_tokens=1_000)
    # session b's 900 tokens evict a's cached 110
    evicted = _drive(one, "session_sticky", [("a", 100, 10), ("b", 900, 10), ("a", 150, 10)])
    assert evicted.recomputed_by_cause == {"routing": 0, "eviction": 110, "preemption": 0}

    async def two_at_once() -> SimEngine:
        engine = SimEngine(one, occupancy_reference=1, router="session_sticky")
        engine.start()
        # both fit when admitted, then outgrow the cache while decoding: the newer is preempted
        await asyncio.gather(engine.generate("x", 400, 300), engine.generate("y", 400, 300))
        await engine.close()
        return engine

    engine = run_virtual(two_at_once())
    assert engine.preemptions >= 1
    assert engine.recomputed_by_cause["preemption"] > 400
    assert engine.prefill_tokens_recomputed == engine.recomputed_by_cause["preemption"]


def test_least_loaded_spreads_new_sessions_evenly_where_hashing_does_not() -> None:
    four = SweSimWorkload(engine_replicas=4)

    async def place(router: str) -> list[int]:
        engine = SimEngine(four, occupancy_reference=1, router=router)
        for i in range(16):
            # the swe-sim's session ids (task/sample/attempt), sample 0 of 16 tasks: the first
            # wave of trajectory-major admission
            session = f"swe-sim-{i:05d}/0/0"
            asyncio.get_running_loop().create_task(engine.generate(session, 100, 10))
        await asyncio.sleep(0)  # every request submitted, none served (no scheduler started)
        return engine.requests_per_replica

    assert run_virtual(place("session_sticky")) == [4, 4, 4, 4]
    # crc32 is linear: these ids differ in few bits, and mod 4 they fall on two replicas
    assert run_virtual(place("session_hash")) == [0, 0, 8, 8]


def test_rotated_jobs_run_every_policy_on_every_seed_in_rotated_order() -> None:
    jobs = rotated_jobs(MULTI_TURN, [0, 1, 2], PIPELINE, ["a", "b", "c"])
    assert [job[4] for job in jobs] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [job[3] for job in jobs] == [0] * 3 + [1] * 3 + [2] * 3
    assert all(job[1] == "pipeline" and job[2] == PIPELINE for job in jobs)
