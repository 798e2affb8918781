"""Time a SWE rollout's runtime in a container against bubblewrap, side by side (not CI).

    PYTHONPATH=src python scripts/bench_swe_starts.py ROWS.jsonl --instance ID [--n 20]

Alternating kinds, `n` times each after one warm-up: `make_runtime` (workspace, runtime start,
code index from its cache), one `exec` of `true`, `close`; then `grades` gold grades of the row
in each kind (the grader's own sandbox or container). The last line is the JSON summary with
p50/p95 in milliseconds (grades: seconds). The row's image must exist (`conveyor images build`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from conveyor.config import RuntimeConfig
from conveyor.tasks.family import get_family
from conveyor.tasks.swe.dataset import find_row
from conveyor.tasks.swe.family import SweFamily
from conveyor.tasks.swe.grading import grade


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def once(family: SweFamily, task) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    began = time.monotonic()
    runtime = await family.make_runtime(task)
    started = time.monotonic()
    await runtime.exec("true", 30)
    ran = time.monotonic()
    await runtime.close()
    return started - began, ran - started, time.monotonic() - ran


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", type=Path)
    parser.add_argument("--instance", required=True)
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--grades", type=int, default=3)
    args = parser.parse_args()
    row = find_row(args.rows, args.instance)
    families = {
        kind: get_family("swe", RuntimeConfig(kind=kind)) for kind in ("bubblewrap", "container")
    }
    tasks = {kind: fam.task(row) for kind, fam in families.items()}  # type: ignore[attr-defined]
    times: dict[str, dict[str, list[float]]] = {
        k: {"start": [], "exec": [], "close": [], "grade": []} for k in families
    }
    for kind, fam in families.items():
        await once(fam, tasks[kind])  # type: ignore[arg-type]
    for _ in range(args.n):
        for kind, fam in families.items():
            start, run, close = await once(fam, tasks[kind])  # type: ignore[arg-type]
            times[kind]["start"].append(start)
            times[kind]["exec"].append(run)
            times[kind]["close"].append(close)
    for _ in range(args.grades):
        for kind, fam in families.items():
            began = time.monotonic()
            report = await grade(row, row.patch, fam.grading)  # type: ignore[attr-defined]
            assert report.resolved, report
            times[kind]["grade"].append(time.monotonic() - began)
    summary = {}
    for kind, parts in times.items():
        out = {}
        for part, values in parts.items():
            scale = 1 if part == "grade" else 1000
            out[f"{part}_p50"] = round(statistics.median(values) * scale, 2)
            out[f"{part}_p95"] = round(pct(values, 0.95) * scale, 2)
        summary[kind] = out
    print(json.dumps({"instance": args.instance, "n": args.n, **summary}))


if __name__ == "__main__":
    asyncio.run(main())
