"""`conveyor eval` then `conveyor view` on its folder: trajectories of the real agent loop, the real
model on in-process vLLM, shown in a real browser token for token."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conveyor.types import Trajectory

pytestmark = pytest.mark.slow


def conveyor(*args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *args], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()


def test_view_of_a_real_eval_run_shows_its_tokens(
    tmp_path: Path, quickstart_eval: tuple[Path, str], open_page: Any
) -> None:
    # the `conveyor eval` run made once per test run (tests/conftest.py): 2 families x 2 tasks
    # x 2 samples, 2 turns of 32 tokens; the page goes to this test's own folder
    run, _ = quickstart_eval
    out = tmp_path / "view.html"
    contract = json.loads(conveyor("view", str(run), "--out", str(out), "--json")[-1])
    trajectories = [
        Trajectory.from_json(line) for line in (run / "trajectories.jsonl").read_text().splitlines()
    ]
    assert contract["trajectories"] == len(trajectories) == 2 * 2 * 2
    assert contract["tokens"] == sum(len(s.input_ids) for t in trajectories for s in t.samples())

    page, log = open_page(out, "#list")
    for index, trajectory in enumerate(trajectories):
        page.goto(out.resolve().as_uri() + f"#t/{index}")
        pane = page.locator(".trajectory")
        assert pane.get_attribute("data-task-id") == trajectory.task_id
        assert pane.get_attribute("data-sample-index") == str(trajectory.sample_index)
        shown = page.eval_on_selector_all(
            ".trajectory .sample",
            "els => els.map(s => Array.from(s.querySelectorAll('span.tok')).map(t => "
            "[+t.dataset.id, +t.dataset.mask, t.dataset.logprob]))",
        )
        for spans, sample in zip(shown, trajectory.samples(), strict=True):
            assert [s[0] for s in spans] == sample.input_ids
            assert [s[1] for s in spans] == sample.loss_mask
            generated = [float(s[2]) for s in spans if s[2] != ""]
            assert generated == [
                lp
                for turn in trajectory.turns
                if turn.sample_index == sample_index_of(sample, trajectory)
                for lp in turn.completion_logprobs
            ]
    assert log.errors == []
    assert set(log.requests) == {out.resolve().as_uri()}


def sample_index_of(sample: Any, trajectory: Trajectory) -> int:
    """Which `sample_index` produced `sample` (samples come in sorted index order)."""
    indices = sorted({t.sample_index for t in trajectory.turns})
    return indices[trajectory.samples().index(sample)]
