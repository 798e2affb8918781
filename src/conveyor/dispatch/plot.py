"""Draw saved dispatcher telemetry: a Gantt chart by stage and an engine-occupancy plot."""

from __future__ import annotations

from pathlib import Path

from conveyor.dispatch.telemetry import Telemetry

TIMELINE_PNG = "dispatch_timeline.png"
OCCUPANCY_PNG = "dispatch_occupancy.png"
_COLOURS = {"init": "#4c72b0", "run": "#55a868", "reward": "#c44e52", "wait": "#dddddd"}


def plot_timeline(run_dir: str | Path) -> list[Path]:
    """Read the telemetry saved in `run_dir` and write two PNGs next to it; returns their paths.

    `dispatch_timeline.png`: one row per trajectory (admission order), bars for init, run and
    reward, grey for time spent waiting in between. `dispatch_occupancy.png`: engine requests in
    flight, live runtimes, run stages in flight and queue depths over time.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(run_dir)
    telemetry = Telemetry.load(folder)
    title = str(telemetry.meta.get("strategy", "dispatch"))
    records = sorted(
        telemetry.trajectories, key=lambda r: (r["timings"].get("admitted", 0.0), r["task_id"])
    )

    fig, ax = plt.subplots(figsize=(11, max(3.0, min(12.0, len(records) * 0.02 + 2))))
    for row, record in enumerate(records):
        timings = record["timings"]
        segments = [("wait", timings.get("admitted"), timings.get("finished"))]
        segments += [
            (s, timings.get(f"{s}_start"), timings.get(f"{s}_end"))
            for s in ("init", "run", "reward")
        ]
        for stage, start, end in segments:
            if start is not None and end is not None and end > start:
                ax.barh(
                    row, end - start, left=start, height=1.0, color=_COLOURS[stage], linewidth=0
                )
    for stage in ("init", "run", "reward", "wait"):
        ax.barh(0, 0, color=_COLOURS[stage], label=stage)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("trajectory (admission order)")
    ax.set_title(f"{title}: stages of every trajectory")
    ax.legend(loc="upper right", ncol=4, fontsize="small")
    fig.tight_layout()
    timeline_path = folder / TIMELINE_PNG
    fig.savefig(timeline_path, dpi=110)
    plt.close(fig)

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    times = [p["t"] for p in telemetry.series]
    for key, label in (
        ("engine_in_flight", "engine requests in flight"),
        ("runs_in_flight", "run stages in flight"),
        ("live_runtimes", "live runtimes"),
    ):
        if any(key in p for p in telemetry.series):
            top.step(times, [p.get(key, 0.0) for p in telemetry.series], where="post", label=label)
    top.set_ylabel("count")
    top.set_title(f"{title}: engine occupancy and live runtimes")
    top.legend(loc="upper right", fontsize="small")
    queue_keys = sorted({k for p in telemetry.series for k in p if k.endswith("_queue")})
    for key in queue_keys:
        bottom.step(times, [p.get(key, 0.0) for p in telemetry.series], where="post", label=key)
    bottom.set_xlabel("seconds since start")
    bottom.set_ylabel("queued jobs")
    if queue_keys:
        bottom.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    occupancy_path = folder / OCCUPANCY_PNG
    fig.savefig(occupancy_path, dpi=110)
    plt.close(fig)
    return [timeline_path, occupancy_path]
