"""The canonical data model: lossless JSONL and training-sample assembly."""

from __future__ import annotations

import math

import pytest

from conveyor.types import EndReason, Status, StopReason, Trajectory, Turn


def _trajectory() -> Trajectory:
    first = Turn(
        prompt_ids=[1, 2, 3],
        completion_ids=[4, 5],
        completion_logprobs=[-0.1, -2.5e-9],
        loss_mask=[1, 1],
        policy_version=3,
    )
    second = Turn(
        prompt_ids=[1, 2, 3, 4, 5, 6, 7],
        completion_ids=[8],
        completion_logprobs=[-math.inf],
        loss_mask=[1],
        policy_version=4,
        stop_reason=StopReason.LENGTH,
    )
    split = Turn(
        prompt_ids=[1, 9],
        completion_ids=[10, 11],
        completion_logprobs=[-1.0, -0.5],
        loss_mask=[1, 0],
        sample_index=1,
    )
    return Trajectory(
        task_id="a",
        sample_index=2,
        turns=[first, second, split],
        messages=[{"role": "user", "content": "ü \n<tool_call>", "_hint": True}],
        reward=0.5,
        status=Status.TRUNCATED,
        stop_reason=EndReason.MAX_TURNS,
        timings={"init_s": 0.1},
        counters={"splits": 1},
        metrics={"x": 1e-300},
    )


def test_jsonl_round_trip_is_lossless() -> None:
    t = _trajectory()
    line = t.to_json()
    assert "\n" not in line
    back = Trajectory.from_json(line)
    assert back == t
    assert back.turns[1].completion_logprobs[0] == -math.inf
    assert back.turns[0].completion_logprobs[1] == -2.5e-9


def test_status_values_are_the_documented_ones() -> None:
    assert {s.value for s in Status} == {
        "ok",
        "truncated",
        "policy_error",
        "timeout",
        "infra_error",
    }


def test_samples_follow_splits_and_align_masks_and_logprobs() -> None:
    first, second = _trajectory().samples()
    assert first.input_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert first.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert first.logprobs[3:5] == [-0.1, -2.5e-9] and first.logprobs[7] == -math.inf
    assert first.min_policy_version == 3 and first.prompt_length == 3
    assert second.input_ids == [1, 9, 10, 11] and second.loss_mask == [0, 0, 1, 0]


def test_samples_reject_a_turn_that_breaks_the_prefix_inside_a_sample() -> None:
    bad = _trajectory().model_copy(
        update={
            "turns": [
                Turn(prompt_ids=[1], completion_ids=[2], completion_logprobs=[0.0], loss_mask=[1]),
                Turn(
                    prompt_ids=[7, 7], completion_ids=[3], completion_logprobs=[0.0], loss_mask=[1]
                ),
            ]
        }
    )
    with pytest.raises(ValueError, match="prefix"):
        bad.samples()


def test_end_reasons_keep_the_strings_run_folders_hold() -> None:
    # the viewer and old run folders read these strings: renaming a member must not change them
    assert {r.value for r in EndReason} == {
        "finish",
        "user_done",
        "max_turns",
        "max_prompt_tokens",
        "max_context_tokens",
        "max_completion_tokens",
        "context_length",
        "no_tool_call",
        "invalid_tool_call",
        "rollout_timeout",
        "run_timeout",
        "infra_retries_exhausted",
        "engine_down",
        "",
    }
    line = _trajectory().model_copy(update={"stop_reason": EndReason.ENGINE_DOWN}).to_json()
    assert '"stop_reason":"engine_down"' in line
    assert '"stop_reason":"length"' in line  # a turn's engine reason, also a plain string
    back = Trajectory.from_json(line)
    assert back.stop_reason is EndReason.ENGINE_DOWN
    assert back.turns[1].stop_reason is StopReason.LENGTH


def test_a_written_trajectory_with_a_plain_string_reason_reads_back_as_the_member() -> None:
    # the dispatcher and old files give plain strings; they validate into the enum
    record = Trajectory(task_id="t", status=Status.TIMEOUT, stop_reason="run_timeout")
    assert record.stop_reason is EndReason.RUN_TIMEOUT
    with pytest.raises(ValueError, match="stop_reason"):
        Trajectory(task_id="t", stop_reason="gave_up")
