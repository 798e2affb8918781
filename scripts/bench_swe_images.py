"""Build the per-task SWE images of a row file and time them (not part of CI).

    PYTHONPATH=src python scripts/bench_swe_images.py ROWS.jsonl [--out bench.json]

For each row: the test-environment layer (built once per dependency list) and the task layer,
cold (built now) or cached (found in the store), with their seconds and the sizes the engine
reports; then one more pass over every row, all cached. The last line is the JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from conveyor.runtime.engine import resolve_engine
from conveyor.runtime.images import ensure_base_image
from conveyor.tasks.swe.dataset import load_rows
from conveyor.tasks.swe.images import ensure_env_image, ensure_task_image, plan_row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    engine = resolve_engine("auto")
    base = ensure_base_image(engine)
    records: list[dict[str, Any]] = []
    for row in load_rows(args.rows):
        began = time.monotonic()
        plan = plan_row(row, base.tag)
        planned = time.monotonic() - began
        env = ensure_env_image(engine, base.tag, plan.deps)
        task = ensure_task_image(engine, plan)
        record = {
            "instance_id": row.instance_id,
            "plan_s": round(planned, 2),
            "env_tag": env.tag,
            "env_built": env.built,
            "env_s": round(env.seconds, 2),
            "env_size": env.size_bytes,
            "task_tag": task.tag,
            "task_built": task.built,
            "task_s": round(task.seconds, 2),
            "task_size": task.size_bytes,
        }
        print(json.dumps(record), flush=True)
        records.append(record)
    cached = []
    for row in load_rows(args.rows):
        began = time.monotonic()
        plan = plan_row(row, base.tag)
        assert not ensure_task_image(engine, plan).built
        cached.append(time.monotonic() - began)
    envs = {r["env_tag"]: r for r in records if r["env_built"]}
    tasks = [r for r in records if r["task_built"]]
    summary = {
        "rows": len(records),
        "env_images_built": len(envs),
        "env_build_s": sorted(r["env_s"] for r in envs.values()),
        "task_images_built": len(tasks),
        "task_build_s_median": statistics.median([r["task_s"] for r in tasks]) if tasks else None,
        "task_build_s_max": max((r["task_s"] for r in tasks), default=None),
        "cached_lookup_s_median": round(statistics.median(cached), 3),
        "cached_lookup_s_max": round(max(cached), 3),
    }
    if args.out:
        args.out.write_text(json.dumps({"records": records, "summary": summary}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
