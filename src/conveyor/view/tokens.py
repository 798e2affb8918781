"""Lay a trajectory's turns out as the token sequences the trainer sees, for display.

Each training sample (a run of turns that keeps the prefix property, see `conveyor.types`) is one
block: the last turn's prompt plus completion, with the loss mask and the engine's logprob on
each completion token and the turn boundaries. Unlike `Trajectory.samples`, a turn that breaks the
prefix property does not raise here: the viewer exists to look at such trajectories, so that
turn becomes its own block marked `broken`.
"""

from __future__ import annotations

import math
from typing import Any

# A JSON number cannot be infinite; these strings are what JavaScript's `Number()` reads back.
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def json_float(value: float | str | None) -> float | str | None:
    """`value` as something `JSON.parse` accepts, with -inf (a logprob of 0 probability) kept."""
    if value is None:
        return None
    value = float(value)
    if math.isnan(value):
        return "NaN"
    return _NON_FINITE.get(value, value)


def lay_out(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Display blocks for the raw turn records of one trajectory (dicts as in the JSONL).

    A block has `sample`, `ids`, `mask`, `lp` (null outside completions), `tr` (trainer logprobs
    when a turn records `trainer_logprobs`), `turns` (`[start, end, policy_version,
    stop_reason]` of each completion) and `broken`.
    """
    by_sample: dict[int, list[dict[str, Any]]] = {}
    for turn in turns:
        by_sample.setdefault(int(turn.get("sample_index", 0)), []).append(turn)
    blocks: list[dict[str, Any]] = []
    for index in sorted(by_sample):
        group = by_sample[index]
        last = group[-1]
        block = _empty_block(index, _ints(last["prompt_ids"]) + _ints(last["completion_ids"]))
        for turn in group:
            start = len(turn["prompt_ids"])
            completion = _ints(turn["completion_ids"])
            if block["ids"][start : start + len(completion)] == completion:
                _fill(block, turn, start)
            else:
                alone = _empty_block(index, _ints(turn["prompt_ids"]) + completion, broken=True)
                _fill(alone, turn, start)
                blocks.append(alone)
        blocks.append(block)
    return blocks


def _empty_block(sample: int, ids: list[int], broken: bool = False) -> dict[str, Any]:
    return {
        "sample": sample,
        "ids": list(ids),
        "mask": [0] * len(ids),
        "lp": [None] * len(ids),
        "tr": None,
        "turns": [],
        "broken": broken,
    }


def _fill(block: dict[str, Any], turn: dict[str, Any], start: int) -> None:
    completion = turn["completion_ids"]
    end = start + len(completion)
    n = len(completion)
    block["mask"][start:end] = _ints(_fit(turn.get("loss_mask", []), n, 0))
    block["lp"][start:end] = [json_float(v) for v in _fit(turn.get("completion_logprobs", []), n)]
    trainer = turn.get("trainer_logprobs")
    if trainer is not None:
        if block["tr"] is None:
            block["tr"] = [None] * len(block["ids"])
        block["tr"][start:end] = [json_float(v) for v in _fit(trainer, n)]
    block["turns"].append(
        [start, end, int(turn.get("policy_version", 0)), str(turn.get("stop_reason", ""))]
    )


def _fit(values: list[Any], n: int, fill: Any = None) -> list[Any]:
    """Exactly `n` values: a record with a short or long per-token list must not shift the
    tokens after it (the gap shows as blanks rather than as wrong values on later tokens)."""
    return list(values[:n]) + [fill] * (n - len(values))


def _ints(values: list[Any]) -> list[int]:
    """Integers, or a ValueError: the page writes these into HTML attributes unescaped."""
    return [int(v) for v in values]
