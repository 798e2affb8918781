"""Token layout of the viewer against the trainer's own `Trajectory.samples`."""

from __future__ import annotations

import json
import math
from typing import Any

from conveyor.types import Status
from conveyor.view.tokens import json_float, lay_out

from .conftest import chosen_outcome_trajectory


def _turns(trajectory: Any) -> list[dict[str, Any]]:
    return json.loads(trajectory.to_json())["turns"]


def test_blocks_equal_the_training_samples_token_for_token(tokenizer: Any) -> None:
    trajectory = chosen_outcome_trajectory(tokenizer, "arithmetic-eval-0001", split=True)
    blocks = lay_out(_turns(trajectory))
    samples = trajectory.samples()
    assert [b["sample"] for b in blocks] == [0, 1]
    for block, sample in zip(blocks, samples, strict=True):
        assert block["ids"] == sample.input_ids
        assert block["mask"] == sample.loss_mask
        generated = [i for i, lp in enumerate(block["lp"]) if lp is not None]
        for i in generated:
            expected = sample.logprobs[i]
            assert block["lp"][i] == ("-Infinity" if expected == -math.inf else expected)
        # Only completion tokens carry a logprob; the prompt glue between turns has none.
        assert len(generated) == sum(
            len(t.completion_ids) for t in trajectory.turns if t.sample_index == block["sample"]
        )
    first = blocks[0]["turns"]
    assert [t[2] for t in first] == [0, 1]  # policy versions of the two turns
    assert first[0][0] == len(trajectory.turns[0].prompt_ids)


def test_a_turn_breaking_the_prefix_property_becomes_its_own_block(tokenizer: Any) -> None:
    turns = _turns(chosen_outcome_trajectory(tokenizer, "filenav-eval-0002"))
    # Turn 0 claims a completion that turn 1's prompt does not contain.
    turns[0]["completion_ids"] = [*turns[0]["completion_ids"][:-1], 9]
    blocks = lay_out(turns)
    broken = [b for b in blocks if b["broken"]]
    assert len(broken) == 1 and broken[0]["ids"][-1] == 9
    whole = next(b for b in blocks if not b["broken"])
    assert len(whole["turns"]) == 1  # the good turn is still placed in the sample


def test_short_per_token_lists_do_not_shift_later_tokens(tokenizer: Any) -> None:
    turns = _turns(chosen_outcome_trajectory(tokenizer, "filenav-eval-0003"))
    n = len(turns[0]["completion_ids"])
    turns[0]["loss_mask"] = [1] * (n - 2)
    (block,) = lay_out(turns)
    start = len(turns[0]["prompt_ids"])
    assert len(block["mask"]) == len(block["ids"])
    assert block["mask"][start : start + n] == [1] * (n - 2) + [0, 0]


def test_trainer_logprobs_are_laid_out_beside_the_engine_ones(tokenizer: Any) -> None:
    turns = _turns(chosen_outcome_trajectory(tokenizer, "filenav-eval-0004", status=Status.OK))
    for turn in turns:
        turn["trainer_logprobs"] = [-0.5] * len(turn["completion_ids"])
    (block,) = lay_out(turns)
    for start, end, _, _ in block["turns"]:
        assert block["tr"][start:end] == [-0.5] * (end - start)
    assert block["tr"][0] is None


def test_non_finite_floats_become_strings_javascript_reads_back() -> None:
    assert json_float(-math.inf) == "-Infinity"
    assert json_float(math.inf) == "Infinity"
    assert json_float(float("nan")) == "NaN"
    assert json_float(-0.25) == -0.25 and json_float(None) is None
