"""Turn a run folder into the page's embedded data, and write the HTML file.

Token text is decoded here, once per distinct id, with the run's own tokenizer; the page stores
the id -> text table and builds token spans only when a trajectory is opened, so a run of
thousands of trajectories still opens quickly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conveyor.view.data import RunFolderError, RunRecords, read_run
from conveyor.view.page import render_page
from conveyor.view.select import DEFAULT_MAX_ROLLOUTS, shown_trajectories
from conveyor.view.stats import summarize_source
from conveyor.view.tokens import json_float, lay_out

Decoder = Callable[[list[int]], dict[int, str]]
_TRAJECTORY_KEYS = ("task_id", "status", "stop_reason", "error", "family", "source")


@dataclass(frozen=True)
class ViewResult:
    """What `conveyor view` wrote: the file, and how many trajectories and token spans it holds."""

    html: Path
    trajectories: int
    tokens: int

    def as_dict(self) -> dict[str, Any]:
        """The `--json` contract: `{"html", "trajectories", "tokens"}`."""
        return {"html": str(self.html), "trajectories": self.trajectories, "tokens": self.tokens}


def tokenizer_decoder(model: str | None) -> Decoder:
    """Decode ids one at a time with the tokenizer of `model` (a folder; None = embedded).

    A folder's `tokenizer.json` is read with the `tokenizers` library alone: importing
    transformers costs more than the rest of a 1,000-trajectory build together.
    """
    from conveyor.models import resolve_model_path

    folder = resolve_model_path(model)
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return lambda ids: {i: fast.decode([i], skip_special_tokens=False) for i in ids}
    from conveyor.engines.factory import load_tokenizer

    tokenizer = load_tokenizer(folder)
    return lambda ids: {i: tokenizer.decode([i]) for i in ids}


def run_model(records: RunRecords) -> str | None:
    """The model path the run's config.yaml names (None = the embedded default)."""
    path = (records.config.get("model") or {}).get("path")
    return str(path) if path else None


def page_data(
    records: RunRecords, decode: Decoder, max_rollouts: int = DEFAULT_MAX_ROLLOUTS
) -> tuple[dict[str, Any], int]:
    """The JSON the page embeds, and the number of token spans it will show."""
    trajectories = []
    tokens = 0
    ids: set[int] = set()
    shown, note = shown_trajectories(records.trajectories, max_rollouts)
    for index, record in enumerate(shown):
        try:
            entry = _entry(index, record)
        except (TypeError, ValueError, KeyError) as error:
            raise RunFolderError(
                f"{records.run_dir}: {record.get('source')} trajectory {index} "
                f"({record.get('task_id')}) has a malformed field: {error!r}"
            ) from error
        for block in entry["blocks"]:
            ids.update(block["ids"])
            tokens += len(block["ids"])
        trajectories.append(entry)
    by_source: dict[str, list[dict[str, Any]]] = {name: [] for name in records.sources}
    for record in records.trajectories:
        if not record.get("superseded_by_refill"):
            by_source[record["source"]].append(record)
    data = {
        "run": {"dir": str(records.run_dir), "name": records.run_dir.name, "kind": records.kind},
        "sources": [
            {"name": name, "summary": summarize_source(items)} for name, items in by_source.items()
        ],
        "reports": finite(records.reports),
        "metrics": finite(records.metrics),
        "trajectories": trajectories,
        "vocab": {str(i): text for i, text in sorted(decode(sorted(ids)).items())},
        "compare": compare_tasks(records.trajectories),
        "warnings": [*records.warnings, *([note] if note else [])],
    }
    return data, tokens


def _entry(index: int, record: dict[str, Any]) -> dict[str, Any]:
    """One trajectory as the page needs it. Numbers are coerced to numbers here because the page
    writes them into HTML unescaped; strings it always escapes."""
    entry: dict[str, Any] = {
        key: None if record.get(key) is None else str(record[key]) for key in _TRAJECTORY_KEYS
    }
    entry["task_id"] = entry["task_id"] or ""
    entry["status"] = entry["status"] or "ok"  # the `Trajectory` default
    step = record.get("step")
    entry.update(
        i=index,
        sample_index=int(record.get("sample_index", 0)),
        step=None if step is None else int(step),
        superseded=bool(record.get("superseded_by_refill", False)),
        reward=json_float(record.get("reward")),
        timings={str(k): json_float(v) for k, v in (record.get("timings") or {}).items()},
        counters={str(k): int(v) for k, v in (record.get("counters") or {}).items()},
        metrics={str(k): json_float(v) for k, v in (record.get("metrics") or {}).items()},
        messages=finite(record.get("messages") or []),
        blocks=lay_out(record.get("turns") or []),
    )
    return entry


def finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by its `json_float` string (JSON has none)."""
    if isinstance(value, float):
        return json_float(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def compare_tasks(trajectories: Iterable[dict[str, Any]]) -> list[str]:
    """Eval task ids present both before and after training; ones whose outcome changed first."""
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for record in trajectories:
        target = {"eval_before": before, "eval_after": after}.get(record["source"])
        if target is not None:
            target[str(record.get("task_id"))] = float(record.get("reward") or 0.0)
    common = [task for task in before if task in after]
    return sorted(common, key=lambda task: (before[task] == after[task], task))


def write_view(
    run_dir: Path,
    out: Path | None = None,
    model: str | None = None,
    decode: Decoder | None = None,
    max_rollouts: int = DEFAULT_MAX_ROLLOUTS,
) -> ViewResult:
    """Write the viewer of `run_dir` to `out` (default `RUN_DIR/view.html`)."""
    records = read_run(run_dir)
    if decode is None:
        decode = tokenizer_decoder(model if model is not None else run_model(records))
    data, tokens = page_data(records, decode, max_rollouts)
    target = out if out is not None else run_dir / "view.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_page(json.dumps(data, allow_nan=False), title=records.run_dir.name))
    return ViewResult(target, len(data["trajectories"]), tokens)
