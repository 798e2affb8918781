"""Grading a BFCL rollout with BFCL's own multi-turn checker, on the instances WE executed.

BFCL's `multi_turn_checker` takes the model's calls as strings and `eval`s them. We never build a
string from model output for `eval`; instead this module runs the same procedure as that function
with BFCL's own parts, feeding it what our runtime already executed safely:

- the ground truth is executed by BFCL's own executor (`execute_multi_turn_func_call`, which
  `eval`s the dataset's answer strings: data, not model output), turn by turn, as BFCL does;
- the model's side is our runtime's record: per turn the rendered results of the calls that
  reached a simulator, and a deep copy of the instances when the turn ended;
- each turn is judged as `multi_turn_checker` judges it: a turn with ground-truth calls fails
  when the model made none (`empty_turn_model_response`: no tool-calling step, by the
  trajectory's count, so a call our validation refused counts as made, as in BFCL); a turn
  without (a `miss_func` / `miss_param` turn where the model should ask) is skipped; otherwise
  BFCL's `state_checker` compares every instance's public attributes and BFCL's
  `response_checker` requires every ground-truth result among the model's results so far;
- as in BFCL's runner, a conversation that did not reach its last turn, or a turn with more steps
  than BFCL's step limit, fails (`force_terminated`).

`tests/tasks/test_bfcl.py` checks the verdicts against BFCL's `multi_turn_checker` run on the
dataset's own strings.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

from conveyor.tasks.bfcl.data import Entry
from conveyor.tasks.bfcl.runtime import BfclRuntime


@dataclass(frozen=True)
class Verdict:
    """The checker's outcome: valid or not, BFCL's error type and message, and how many of the
    turns with ground-truth calls passed before the first failure."""

    valid: bool
    error_type: str = ""
    message: str = ""
    turns_passed: int = 0
    turns_checked: int = 0


def check(entry: Entry, runtime: BfclRuntime, steps_per_turn: list[int], max_steps: int) -> Verdict:
    """BFCL's multi-turn verdict on one rollout (see the module docstring)."""
    checked = sum(1 for calls in entry.answer if calls)
    if not runtime.done or len(runtime.snapshots) != len(entry.answer):
        return Verdict(
            False,
            "multi_turn:force_terminated",
            f"the conversation ended after {len(runtime.snapshots)} of {len(entry.answer)} turns",
            turns_checked=checked,
        )
    over = [t for t, steps in enumerate(steps_per_turn) if steps > max_steps]
    if over:
        return Verdict(
            False,
            "multi_turn:force_terminated",
            f"turn {over[0]} took {steps_per_turn[over[0]]} steps (limit {max_steps})",
            turns_checked=checked,
        )
    with _GroundTruth(entry) as truth:
        return _check_turns(entry, runtime, truth, checked, steps_per_turn)


def _check_turns(
    entry: Entry, runtime: BfclRuntime, truth: _GroundTruth, checked: int, steps_per_turn: list[int]
) -> Verdict:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
        response_checker,
        state_checker,
    )

    model_results: list[str] = []
    passed = 0
    for turn, calls in enumerate(entry.answer):
        truth_results, truth_instances = truth.run(calls)
        turn_results = [executed.result for executed in runtime.results[turn]]
        model_results.extend(turn_results)
        if not calls:
            continue
        # BFCL's "empty turn" is a turn without tool-calling steps; a call our validation
        # refused is a step too (BFCL's executor runs it and records its error)
        stepped = turn < len(steps_per_turn) and steps_per_turn[turn] > 0
        if not turn_results and not stepped:
            return Verdict(
                False,
                "multi_turn:empty_turn_model_response",
                f"Model response list is empty for turn {turn}",
                passed,
                checked,
            )
        for result in (
            state_checker(runtime.snapshots[turn], truth_instances),
            response_checker(model_results, truth_results, turn),
        ):
            if not result["valid"]:
                return Verdict(
                    False, result["error_type"], result["error_message"], passed, checked
                )
        passed += 1
    return Verdict(True, turns_passed=passed, turns_checked=checked)


class _GroundTruth:
    """BFCL's executor on the dataset's answer strings, one turn after another.

    The executor keeps its instances in its module's globals under a name made of a model name
    and the entry id, and reuses them on the next turn: each grading gets a fresh, unique model
    name, and its instances are dropped on exit.
    """

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.name = f"conveyor_{uuid.uuid4().hex}"

    def __enter__(self) -> _GroundTruth:
        return self

    def run(self, calls: list[str]) -> tuple[list[str], dict[str, Any]]:
        """Execute one turn's answer strings on the ground-truth instances."""
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import (
            execute_multi_turn_func_call,
        )

        results, instances = execute_multi_turn_func_call(
            func_call_list=calls,
            initial_config=self.entry.initial_config,
            involved_classes=self.entry.classes,
            model_name=self.name,
            test_entry_id=self.entry.id,
            long_context=self.entry.long_context,
            is_evaL_run=True,
        )
        return list(results), dict(instances)

    def __exit__(self, *exc: object) -> None:
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

        prefix = re.sub(r"[-./:]", "_", self.name)
        namespace = vars(multi_turn_utils)
        for key in [k for k in namespace if k.startswith(prefix)]:
            del namespace[key]
