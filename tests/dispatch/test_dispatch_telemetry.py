"""Telemetry is saved, read back and drawn; the bench CLI keeps its JSON contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.bench.dispatch import simulate
from conveyor.dispatch.plot import plot_timeline
from conveyor.dispatch.telemetry import Telemetry
from conveyor.sim.swe import SweSimWorkload

SMALL = SweSimWorkload(
    tasks=6, samples_per_task=4, turns_min=3, turns_max=6, max_live_runtimes=12, cpu_slots=4
)


def test_telemetry_round_trip_and_plots(tmp_path: Path) -> None:
    telemetry = Telemetry()
    result = simulate(SMALL, "pipeline", {"p_init": 4, "p_run": 12, "p_reward": 4}, 0, telemetry)
    telemetry.meta = {"strategy": "pipeline"}
    telemetry.save(tmp_path)
    loaded = Telemetry.load(tmp_path)
    assert len(loaded.trajectories) == SMALL.trajectories
    record = loaded.trajectories[0]["timings"]
    assert {"init_start", "run_end", "reward_queue_wait", "finished"} <= set(record)
    assert loaded.series[-1]["finished"] == SMALL.trajectories
    assert {"live_runtimes", "engine_in_flight", "run_queue", "init_queue"} <= set(loaded.series[0])
    assert max(p["live_runtimes"] for p in loaded.series) <= SMALL.max_live_runtimes
    assert max(p["engine_in_flight"] for p in loaded.series) > 0
    assert loaded.summary()["by_status"] == {"ok": SMALL.trajectories}
    assert result["peak_live_runtimes"] <= SMALL.max_live_runtimes
    paths = plot_timeline(tmp_path)
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


@pytest.mark.slow
def test_bench_cli_prints_the_contract_as_its_last_line(tmp_path: Path) -> None:
    code = (
        "import sys; from conveyor.bench.cli import bench_app; "
        "sys.argv = ['conveyor', 'dispatch', '--workload', 'swe-sim', '--json', '--seeds', '1',"
        " '--tasks', '4', '--processes', '1', '--strategies', 'batch,bounded_batch,pipeline',"
        f" '--out', {str(tmp_path / 'r.json')!r}]; bench_app()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("batch", "bounded_batch", "pipeline"):
        entry = report["strategies"][name]
        for key in (
            "throughput",
            "engine_utilisation",
            "peak_live_runtimes",
            "makespan_s",
            "first_group_s",
            "efficiency",
        ):
            assert isinstance(entry[key], int | float)
        assert entry["peak_live_runtimes"] <= report["limits"]["max_live_runtimes"]
        assert 0 < entry["efficiency"] <= 1.0
    assert set(report["ratios"]) == {"pipeline_over_bounded_batch", "pipeline_over_batch"}
    assert report["bound_s"] > 0 and report["efficiency"] > 0
    assert json.loads((tmp_path / "r.json").read_text())["bound_s"] == report["bound_s"]


def test_bench_cli_unknown_workload_is_a_clear_error() -> None:
    code = (
        "import sys; from conveyor.bench.cli import bench_app; "
        "sys.argv = ['conveyor', 'dispatch', '--workload', 'swe-real']; bench_app()"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "unknown workload" in done.stderr


def test_bench_cli_import_is_light() -> None:
    code = (
        "import sys; import conveyor.bench.cli; "
        "print(sorted(m for m in ('matplotlib', 'ray', 'numpy', 'conveyor.bench.dispatch')"
        " if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
