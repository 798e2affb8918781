"""Issue 18's acceptance for engine replicas: two real vLLM server processes (`engine.replicas:
2`, started and stopped by the run) serve one `conveyor eval` of the quickstart config, and one
of them is killed mid-run.

Checked against the servers' own request logs (`--enable-log-requests`: each request is logged
under the `X-Request-Id` our client sends, which ends in the rollout's session id): every
rollout's requests reach one server unless its server died (then the rest of it, or all of it
again after a counted infra retry, reach the other); both servers took load; every rollout is
recorded, none as an infra error, and the greedy token ids of every turn equal a single
in-process engine's run, the moved rollouts' included; the servers are gone afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from conveyor.config import load_config
from conveyor.types import Status, Trajectory

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# The quickstart config, greedy, a short run: 8 rollouts of up to 4 turns, all at once. The
# base model answers filenav in one long turn; search questions take it several short turns
# (a rollout that spans requests is what stickiness is about), so both families run.
COMMON = [
    "tasks.families=[filenav, search]",
    "tasks.num_tasks=4",
    "tasks.group_size=1",
    "tasks.split=eval",
    "sampling.temperature=0",
    "agent.max_turns=4",
    "agent.max_completion_tokens=48",
    "engine.max_num_seqs=8",
    "engine.kv_cache_gib=1",
    "dispatch.p_run=8",
    "dispatch.max_parallel=8",
]
_LOGGED = re.compile(r"Received request cmpl-[0-9a-f]+\.\d+\.(?P<session>\S+?)-0: params")
_SERVER = "vllm.entrypoints.openai.api_server"


def _eval(overrides: list[str]) -> None:
    from conveyor.app.evaluate import run_eval

    resolved = load_config(REPO / "configs" / "filenav.yaml", [*COMMON, *overrides])
    asyncio.run(run_eval(resolved, show_progress=False))


def _servers() -> dict[int, Path]:
    """Our replica servers (children of this process): pid -> the log their output goes to."""
    found: dict[int, Path] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            log = Path(os.readlink(entry / "fd" / "1"))
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and _SERVER in command:
            found[int(entry.name)] = log
    return found


def _sessions(log: Path) -> list[str]:
    """The session of every request the server logged, in order."""
    return [m["session"] for m in _LOGGED.finditer(log.read_text(errors="replace"))]


def _recorded(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    lines = path.read_text().splitlines()
    return {f"{json.loads(line)['task_id']}/0" for line in lines if line.endswith("}")}


async def _kill_one_replica_mid_run(trajectories: Path) -> Path:
    """Once a rollout is recorded, SIGKILL (with its engine core) the replica server with the
    most unfinished rollouts; its log."""
    while True:
        done = _recorded(trajectories)
        servers = _servers()
        if done and len(servers) == 2:
            unfinished = {pid: len(set(_sessions(log)) - done) for pid, log in servers.items()}
            victim = max(unfinished, key=lambda pid: unfinished[pid])
            if unfinished[victim]:
                os.killpg(victim, signal.SIGKILL)
                return servers[victim]
        await asyncio.sleep(0.2)


def _routed_eval_with_a_kill(run_dir: Path) -> Path:
    from conveyor.app.evaluate import run_eval

    resolved = load_config(
        REPO / "configs" / "filenav.yaml",
        [
            *COMMON,
            "engine.replicas=2",
            "engine.server_args=[--enable-log-requests]",
            "engine.reconnect_s=2",  # a dead replica is given up after 2 s
            f"run.dir={run_dir}",
        ],
    )

    async def go() -> Path:
        run = asyncio.create_task(run_eval(resolved, show_progress=False))
        killer = asyncio.create_task(_kill_one_replica_mid_run(run_dir / "trajectories.jsonl"))
        await asyncio.wait([run, killer], return_when=asyncio.FIRST_COMPLETED)
        if not killer.done():
            killer.cancel()
            await run  # the run's own error, if it failed
            raise AssertionError("the run ended before a replica could be killed mid-run")
        await asyncio.wait_for(run, timeout=300)  # no hang
        return killer.result()

    return asyncio.run(go())


def _by_task(run_dir: Path) -> dict[str, Trajectory]:
    lines = (run_dir / "trajectories.jsonl").read_text().splitlines()
    trajectories = [Trajectory.from_json(line) for line in lines]
    assert len(trajectories) == 8  # every rollout recorded, once
    return {t.task_id: t for t in trajectories}


def test_two_vllm_replicas_serve_one_eval_sticky_split_greedy_equal_and_a_kill_loses_nothing(
    tmp_path: Path, model_dir: Path
) -> None:
    del model_dir  # prepared by the fixture; the configs' null model.path is this folder
    started = time.monotonic()
    _eval([f"run.dir={tmp_path / 'single'}"])
    single = _by_task(tmp_path / "single")
    single_s = time.monotonic() - started
    killed_log = _routed_eval_with_a_kill(tmp_path / "routed")
    routed = _by_task(tmp_path / "routed")
    summary = json.loads((tmp_path / "routed" / "summary.json").read_text())
    replicas = summary["engine_replicas"]["replicas"]
    assert not _servers()  # both servers (and their engine cores) are gone

    # nothing lost, and the greedy ids of every turn are the single engine's
    assert all(t.status is not Status.INFRA_ERROR for t in routed.values())
    assert set(routed) == set(single)
    for task_id, trajectory in routed.items():
        ids = [list(turn.completion_ids) for turn in trajectory.turns]
        assert ids == [list(turn.completion_ids) for turn in single[task_id].turns], task_id

    # the servers' logs: load split, and each rollout on one server until its server died
    logs = {Path(r["log"]): _sessions(Path(r["log"])) for r in replicas}
    assert killed_log in logs and all(logs.values())  # both served requests
    survivor = next(log for log in logs if log != killed_log)
    on: dict[str, set[Path]] = defaultdict(set)
    for log, sessions in logs.items():
        for session in sessions:
            on[session].add(log)
    retried = {f"{t}/0" for t, tr in routed.items() if tr.counters.get("infra_retries")}
    assert retried, "the killed replica had unfinished rollouts: they must be retried"
    split = {s for s, where in on.items() if len(where) == 2}
    assert retried <= on.keys() and all(survivor in on[s] for s in retried)
    # a rollout reached both servers only because its first one died under it
    assert split <= {s for s in on if killed_log in on[s]}
    assert summary["engine_replicas"]["moved_sessions"] >= len(split)
    down = [r for r in replicas if r["down"]]
    assert len(down) == 1 and Path(down[0]["log"]) == killed_log
    counted = next(r for r in replicas if Path(r["log"]) == survivor)
    assert counted["requests"] == len(logs[survivor])  # every routed request reached it
    print(
        f"single engine {single_s:.0f}s; routed {summary['wall_s']:.0f}s "
        f"(engine start {summary['engine_start_s']:.0f}s); retried {len(retried)}, "
        f"split {len(split)}, requests {[r['requests'] for r in replicas]}"
    )
