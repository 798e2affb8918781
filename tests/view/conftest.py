"""Run folders for the viewer's tests, and a headless browser to open the pages in.

Trajectories here are built from the real tokenizer's rendering of real chats, so token ids,
template glue and turn boundaries are what the agent loop produces; the logprobs and outcomes are
chosen by the test (a model run cannot be steered to given statuses), which the builders' names
say. The end-to-end test in test_view_e2e.py uses trajectories of the real agent loop instead.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conveyor.types import Status, Trajectory, Turn

CHROMIUM = "chromium-headless-shell"


def _encode(tokenizer: Any, messages: list[dict[str, Any]], generation: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
    return list(tokenizer.encode(text, add_special_tokens=False))


def chat_turns(tokenizer: Any, task_id: str, replies: list[str], hint: bool) -> list[Turn]:
    """Turns of one sample: each prompt is the real template rendering of the chat so far, so
    turn k's prompt starts with turn k-1's prompt and completion (the prefix property)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Answer with a tool call."},
        {"role": "user", "content": f"Solve {task_id}."},
    ]
    turns = []
    for k, reply in enumerate(replies):
        prompt = _encode(tokenizer, messages, generation=True)
        full = _encode(tokenizer, [*messages, {"role": "assistant", "content": reply}], False)
        assert full[: len(prompt)] == prompt
        completion = full[len(prompt) :]
        # The template may end a turn with a newline after <|im_end|>: glue, not sampled.
        mask = [1] * len(completion)
        if tokenizer.decode(completion[-1:]) == "\n":
            mask[-1] = 0
        logprobs = [-0.05 * (1 + (i % 7)) for i in range(len(completion))]
        if k == 0:
            logprobs[0] = -math.inf  # a zero-probability token must survive the trip to the page
        turns.append(
            Turn(
                prompt_ids=prompt,
                completion_ids=completion,
                completion_logprobs=logprobs,
                loss_mask=mask,
                policy_version=k,
            )
        )
        messages.append({"role": "assistant", "content": reply})
        note = "[hint] call a tool" if hint and k == 0 else "tool output 42"
        messages.append({"role": "user", "content": note, **({"_hint": True} if hint else {})})
    return turns


def chosen_outcome_trajectory(
    tokenizer: Any,
    task_id: str,
    sample_index: int = 0,
    status: Status = Status.OK,
    reward: float | None = 1.0,
    hint: bool = False,
    split: bool = False,
) -> Trajectory:
    """A trajectory with real tokens and a test-chosen outcome; `split` adds a second sample."""
    turns = chat_turns(tokenizer, task_id, ["Let me look.", "The answer is 7."], hint)
    if split:
        extra = chat_turns(tokenizer, task_id + " again", ["Done."], hint=False)
        turns += [t.model_copy(update={"sample_index": 1}) for t in extra]
    return Trajectory(
        task_id=task_id,
        sample_index=sample_index,
        turns=turns,
        messages=[
            {"role": "user", "content": f"Solve {task_id}. </script><b>x</b>"},
            {"role": "assistant", "content": "The answer is 7."},
            *([{"role": "user", "content": "[hint] call a tool", "_hint": True}] if hint else []),
        ],
        reward=None if status is Status.INFRA_ERROR else reward,
        status=status,
        stop_reason="finish" if status is Status.OK else "max_turns",
        timings={
            "init_start": 0.1 * sample_index,
            "init_end": 0.2 + 0.1 * sample_index,
            "run_start": 0.3,
            "run_end": 1.5,
            "reward_start": 1.5,
            "reward_end": 1.6,
        },
        counters={"hints": int(hint), "splits": int(split), "tool_calls": 2},
        metrics={"completion_tokens": float(sum(len(t.completion_ids) for t in turns))},
    )


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """JSONL as the run writes it (-inf as -Infinity, like pydantic's `to_json`)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def as_record(trajectory: Trajectory, **extra: Any) -> dict[str, Any]:
    """The JSON record of a trajectory, with fields a newer run adds (`step`, per-turn fields)."""
    record: dict[str, Any] = json.loads(trajectory.to_json())
    record.update(extra)
    return record


@pytest.fixture(scope="session")
def eval_trajectories(tokenizer: Any) -> list[Trajectory]:
    """Two families, two samples each, every status the list can filter by."""
    out = []
    for family, statuses in (
        ("arithmetic", [Status.OK, Status.TRUNCATED]),
        ("filenav", [Status.POLICY_ERROR, Status.INFRA_ERROR]),
    ):
        for index, status in enumerate(statuses):
            for sample in range(2):
                out.append(
                    chosen_outcome_trajectory(
                        tokenizer,
                        f"{family}-eval-{index:04d}",
                        sample,
                        status,
                        reward=1.0 if status is Status.OK and sample == 0 else 0.0,
                        hint=status is Status.TRUNCATED,
                        split=status is Status.POLICY_ERROR,
                    )
                )
    return out


@pytest.fixture
def eval_run(tmp_path: Path, eval_trajectories: list[Trajectory]) -> Path:
    """An eval run folder as `conveyor eval` lays it out."""
    run = tmp_path / "eval-run"
    run.mkdir()
    (run / "config.yaml").write_text(
        "model:\n  path: null\ntasks:\n  families: [arithmetic, filenav]\n"
    )
    write_jsonl(run / "trajectories.jsonl", [as_record(t) for t in eval_trajectories])
    return run


@dataclass
class PageLog:
    """What a page did besides rendering: console errors and every request it made."""

    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's headless Chromium driven by playwright; skipped where either is missing.

    One per test file, never per session: playwright's sync API marks an event loop running in
    the main thread while it is open, and every `asyncio.run` in that process fails meanwhile
    (a session-long browser failed 84 tests that a parallel run gave the same worker later).
    """
    executable = shutil.which(CHROMIUM)
    if executable is None:
        pytest.skip(f"{CHROMIUM} not installed (apt-get install {CHROMIUM}; see bootstrap.sh)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable)
        yield launched
        launched.close()


@pytest.fixture
def open_page(browser: Any) -> Iterator[Any]:
    """`open_page(html_file, hash)` -> (page, log), the page rendered and ready."""
    pages = []

    def open_(html: Path, fragment: str = "") -> tuple[Any, PageLog]:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        log = PageLog()
        page.on("console", lambda m: log.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: log.errors.append(str(e)))
        page.on("request", lambda r: log.requests.append(r.url))
        page.goto(html.resolve().as_uri() + fragment)
        page.wait_for_selector("body[data-ready='1']")
        pages.append(page)
        return page, log

    yield open_
    for page in pages:
        page.close()
