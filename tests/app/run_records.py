"""Reading a run folder's records back, for the tests that compare two runs of one config
(test_cluster.py: a Ray cluster against one process; test_scale_twin.py: the scale twin against
one process)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of `path`."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def rollouts(run_dir: Path) -> list[tuple[Any, ...]]:
    """What each rollout sampled and scored, in a canonical order."""
    out = []
    for r in records(run_dir / "rollouts.jsonl"):
        tokens = tuple(tuple(turn["completion_ids"]) for turn in r["turns"])
        out.append((r["step"], r["task_id"], r["sample_index"], r["status"], r["reward"], tokens))
    return sorted(out)
