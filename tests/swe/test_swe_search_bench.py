"""`conveyor bench search` on factory rows: each row is searched in its own starting state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_project import tiny_row

from conveyor.bench import search as bench


def test_factory_rows_need_no_checkout(tmp_path: Path) -> None:
    row = tiny_row("tinycalc__search_bench")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(row.model_dump(mode="json")) + "\n")
    pairs = bench.load_rows(tasks, None)
    root = pairs[0][1]
    assert "return a - b" in (root / "tinycalc" / "__init__.py").read_text(), "the starting state"
    report = bench.bench_rows(pairs)
    assert report["tasks"] == 1 and report["groups"][0]["group"] == "pypi:conveyor-tinycalc"
    assert report["methods"]["search_code"]["file_top1"] == 1.0
    assert report["groups"][0]["index"]["build_seconds"] > 0


def test_a_git_row_without_checkout_is_refused(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    row = {"instance_id": "a__b-1", "repo": "a/b", "problem_statement": "x", "patch": ""}
    tasks.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="needs --repo-root"):
        bench.load_rows(tasks, None)
