"""What the dispatcher saw: per-trajectory stage times and, over time, queues and occupancy.

Saved into the run folder as `dispatch_trajectories.jsonl` (one line per trajectory: stage
start/end and queue waits, seconds since the dispatcher started), `dispatch_series.jsonl` (one
line per sample: queue depths, live runtimes, run stages and engine requests in flight) and
`dispatch_summary.json` (with `runtime_starts`: the stages' runtime start counters at the
end, when the stages report them: starts, rate-limit waits, warm pool hits, joins and misses).
`conveyor.dispatch.plot.plot_timeline` draws them.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

from conveyor.types import Trajectory

TRAJECTORIES_FILE = "dispatch_trajectories.jsonl"
SERIES_FILE = "dispatch_series.jsonl"
SUMMARY_FILE = "dispatch_summary.json"


class Telemetry:
    """Collects dispatcher telemetry; `keep_trajectories=False` keeps only the time series.

    Records hold timings and status only (never turns), so they stay small at any scale.
    """

    def __init__(self, keep_trajectories: bool = True) -> None:
        self.keep_trajectories = keep_trajectories
        self.trajectories: list[dict[str, Any]] = []
        self.series: list[dict[str, float]] = []
        self.meta: dict[str, Any] = {}

    def record(self, trajectory: Trajectory) -> None:
        """Keep the timing record of one finished trajectory."""
        if not self.keep_trajectories:
            return
        self.trajectories.append(
            {
                "task_id": trajectory.task_id,
                "sample_index": trajectory.sample_index,
                "status": str(trajectory.status),
                "timings": dict(trajectory.timings),
                "infra_retries": trajectory.counters.get("infra_retries", 0),
            }
        )

    def sample(self, t: float, values: dict[str, float]) -> None:
        """One point of the time series at dispatcher time `t`."""
        self.series.append({"t": t, **values})

    def time_weighted_mean(self, key: str) -> float:
        """Mean of a series value, each sample weighted by how long it held."""
        points = [(p["t"], p.get(key, 0.0)) for p in self.series]
        if len(points) < 2:
            return float(points[0][1]) if points else 0.0
        total = 0.0
        for (t0, v), (t1, _) in pairwise(points):
            total += v * (t1 - t0)
        span = points[-1][0] - points[0][0]
        return total / span if span > 0 else float(points[0][1])

    def peak(self, key: str) -> float:
        """Largest sampled value of a series."""
        return max((p.get(key, 0.0) for p in self.series), default=0.0)

    def summary(self) -> dict[str, Any]:
        """Aggregates: counts by status, mean stage times and queue waits, peaks."""
        by_status: dict[str, int] = {}
        sums: dict[str, float] = {}
        for record in self.trajectories:
            by_status[record["status"]] = by_status.get(record["status"], 0) + 1
            timings = record["timings"]
            for stage in ("init", "run", "reward"):
                if f"{stage}_start" in timings and f"{stage}_end" in timings:
                    key = f"{stage}_s"
                    sums[key] = (
                        sums.get(key, 0.0) + timings[f"{stage}_end"] - timings[f"{stage}_start"]
                    )
                wait = timings.get(f"{stage}_queue_wait")
                if wait is not None:
                    sums[f"{stage}_queue_wait_s"] = sums.get(f"{stage}_queue_wait_s", 0.0) + wait
        count = max(1, len(self.trajectories))
        last = self.series[-1] if self.series else {}
        starts = {
            k.removeprefix("runtime_"): v for k, v in last.items() if k.startswith("runtime_")
        }
        return {
            **self.meta,
            "trajectories": len(self.trajectories),
            "by_status": by_status,
            "mean": {key: value / count for key, value in sorted(sums.items())},
            "peak_live_runtimes": self.peak("live_runtimes"),
            "mean_engine_in_flight": self.time_weighted_mean("engine_in_flight"),
            **({"runtime_starts": starts} if starts else {}),
        }

    def save(self, run_dir: str | Path) -> Path:
        """Write the three telemetry files into `run_dir`; returns the folder."""
        folder = Path(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / TRAJECTORIES_FILE).open("w") as handle:
            for record in self.trajectories:
                handle.write(json.dumps(record) + "\n")
        with (folder / SERIES_FILE).open("w") as handle:
            for point in self.series:
                handle.write(json.dumps(point) + "\n")
        (folder / SUMMARY_FILE).write_text(json.dumps(self.summary(), indent=2) + "\n")
        return folder

    @classmethod
    def load(cls, run_dir: str | Path) -> Telemetry:
        """Read back what `save` wrote."""
        folder = Path(run_dir)
        telemetry = cls()
        for line in (folder / TRAJECTORIES_FILE).read_text().splitlines():
            telemetry.trajectories.append(json.loads(line))
        for line in (folder / SERIES_FILE).read_text().splitlines():
            telemetry.series.append(json.loads(line))
        summary_path = folder / SUMMARY_FILE
        if summary_path.exists():
            summary = json.loads(summary_path.read_text())
            telemetry.meta = {k: v for k, v in summary.items() if k not in _DERIVED}
        return telemetry


_DERIVED = {
    "trajectories",
    "by_status",
    "mean",
    "peak_live_runtimes",
    "mean_engine_in_flight",
    "runtime_starts",
}
