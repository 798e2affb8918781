"""Read a run folder (from `conveyor eval` or `conveyor train`) into plain records for the page.

Trajectories are read as raw JSON dicts, not as `Trajectory` models: `rollouts.jsonl` lines carry
extra fields (`step`, `superseded_by_refill`) and a run written by a newer version may carry
per-turn fields (such as `trainer_logprobs`) this version does not know; the viewer shows them
all rather than refusing the file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# Trajectory files of a run folder, in the order their sources are listed on the page.
TRAJECTORY_FILES: dict[str, str] = {
    "eval": "trajectories.jsonl",
    "eval_before": "eval_before.trajectories.jsonl",
    "eval_after_sft": "eval_after_sft.trajectories.jsonl",
    "eval_after": "eval_after.trajectories.jsonl",
    "rollouts": "rollouts.jsonl",
}
REPORT_FILES = ("summary.json", "eval_before.json", "eval_after_sft.json", "eval_after.json")
# Built-in families name their instances `<family>-<split>-<index>` (see tasks/family.py).
_TASK_ID = re.compile(r"^(?P<family>.+)-[A-Za-z0-9_]+-\d+$")


class RunFolderError(ValueError):
    """The folder is not a readable run folder; the message says what is missing or wrong."""


@dataclass
class RunRecords:
    """What a run folder holds, as read from disk."""

    run_dir: Path
    config: dict[str, Any]
    reports: dict[str, Any]
    metrics: list[dict[str, Any]]
    trajectories: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """`train` when the folder has training records, `eval` otherwise."""
        trained = any(t["source"] != "eval" for t in self.trajectories) or self.metrics
        return "train" if trained else "eval"

    @property
    def sources(self) -> list[str]:
        """The trajectory sources present, in page order."""
        present = {t["source"] for t in self.trajectories}
        return [name for name in TRAJECTORY_FILES if name in present]


def read_run(run_dir: Path) -> RunRecords:
    """Every trajectory, report and metric of `run_dir`; raises `RunFolderError` when none."""
    if not run_dir.is_dir():
        raise RunFolderError(f"{run_dir} is not a folder")
    found = [name for name, file in TRAJECTORY_FILES.items() if (run_dir / file).is_file()]
    if not found:
        raise RunFolderError(
            f"{run_dir} holds none of {', '.join(TRAJECTORY_FILES.values())}: "
            "not a run folder of `conveyor eval` or `conveyor train`"
        )
    warnings: list[str] = []
    config = _read_config(run_dir / "config.yaml", warnings)
    families = list((config.get("tasks") or {}).get("families") or [])
    trajectories: list[dict[str, Any]] = []
    for source in found:
        for record in _read_jsonl(run_dir / TRAJECTORY_FILES[source], warnings):
            record["source"] = source
            record["family"] = family_of(str(record.get("task_id", "")), families)
            trajectories.append(record)
    reports = {}
    for name in REPORT_FILES:
        path = run_dir / name
        if path.is_file():
            try:
                reports[name.removesuffix(".json")] = json.loads(path.read_text())
            except json.JSONDecodeError as error:
                warnings.append(f"{name} is not valid JSON ({error}); its report is not shown")
    metrics_path = run_dir / "metrics.jsonl"
    metrics = _read_jsonl(metrics_path, warnings) if metrics_path.is_file() else []
    return RunRecords(run_dir, config, reports, metrics, trajectories, warnings)


def family_of(task_id: str, families: list[str]) -> str:
    """The task family of `task_id`: a configured family it starts with, its id pattern, or the
    only configured family (SWE instance ids such as `django__django-1234` carry none)."""
    for name in sorted(families, key=len, reverse=True):
        if task_id.startswith(f"{name}-"):
            return name
    match = _TASK_ID.match(task_id)
    if match:
        return match["family"]
    return families[0] if len(families) == 1 else "unknown"


def _read_config(path: Path, warnings: list[str]) -> dict[str, Any]:
    if not path.is_file():
        warnings.append("no config.yaml: families come from task ids, the model from --model")
        return {}
    loaded = yaml.safe_load(path.read_text())
    return loaded if isinstance(loaded, dict) else {}


def _read_jsonl(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    """The records of `path`. A torn last line (a run killed mid-write) is skipped and said so in
    the page; a bad line elsewhere means the file is not what we think it is, so it is an error."""
    lines = path.read_text().splitlines()
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                warnings.append(f"{path.name}: torn last line {number} skipped ({error})")
                continue
            raise RunFolderError(f"{path}:{number}: not a JSON line ({error})") from error
        if not isinstance(record, dict):
            raise RunFolderError(f"{path}:{number}: expected a JSON object")
        records.append(record)
    return records
