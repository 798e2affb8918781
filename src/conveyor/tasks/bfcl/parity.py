"""Parity of our BFCL grading with BFCL's own `multi_turn_checker`, on gold and perturbed answers.

`conveyor tasks parity bfcl` runs it (docs/benchmarks-bfcl-tau2.md has the numbers). For each
answer (an entry's ground truth, or a perturbation of it: a call dropped, a turn emptied, an
argument changed, two calls swapped, a call repeated, a call moved to the turn before, a call
renamed to a sibling function, a harmless read added), both sides judge it:

- ours: every call goes, as a model's would, through the task's real tool registry
  (`SimulatorTool` validation, then the `BfclRuntime`), each turn is closed, and
  `conveyor.tasks.bfcl.grading.check` gives the verdict;
- BFCL's: `multi_turn_checker` on the same calls as strings, one a step, as BFCL's evaluation
  runner hands it decoded model output. The strings are our perturbations of the dataset's own
  literals, never model output.

A pair agrees when both say valid, or both say invalid with the same error type.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conveyor.agent.tools import ToolContext
from conveyor.tasks.bfcl.data import CATEGORIES, Entry, function_docs, load_category, parse_call
from conveyor.tasks.bfcl.grading import check
from conveyor.tasks.bfcl.runtime import BfclRuntime
from conveyor.types import Task, ToolCall

Answer = list[list[str]]


@dataclass(frozen=True)
class Case:
    """One answer to judge: the entry, what was done to its ground truth, the answer."""

    entry: Entry
    kind: str
    answer: Answer


def _calls(answer: Answer) -> list[tuple[int, int]]:
    return [(t, i) for t, turn in enumerate(answer) for i in range(len(turn))]


def _copy(answer: Answer) -> Answer:
    return [list(turn) for turn in answer]


def _drop_call(answer: Answer, rng: random.Random, entry: Entry) -> Answer | None:
    spots = _calls(answer)
    if not spots:
        return None
    t, i = rng.choice(spots)
    out = _copy(answer)
    del out[t][i]
    return out


def _empty_turn(answer: Answer, rng: random.Random, entry: Entry) -> Answer | None:
    turns = [t for t, turn in enumerate(answer) if turn]
    if not turns:
        return None
    out = _copy(answer)
    out[rng.choice(turns)] = []
    return out


def _changed(value: Any, rng: random.Random) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([-1, 1, 7])
    if isinstance(value, float):
        return round(value * 1.5 + 1.0, 2)
    if isinstance(value, str):
        return value + rng.choice(["x", "_2", " "]) if value else "x"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    if isinstance(value, dict):
        return {**value, "x": 1}
    return "x"


def _render(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({','.join(parts)})"


def _mutate_arg(answer: Answer, rng: random.Random, entry: Entry) -> Answer | None:
    spots = [(t, i) for t, i in _calls(answer) if _has_args(answer[t][i])]
    if not spots:
        return None
    t, i = rng.choice(spots)
    call = parse_call(answer[t][i])
    args, kwargs = list(call.args), dict(call.kwargs)
    slots = [("a", n) for n in range(len(args))] + [("k", k) for k in kwargs]
    where, key = rng.choice(slots)
    if where == "a":
        args[int(key)] = _changed(args[int(key)], rng)
    else:
        kwargs[str(key)] = _changed(kwargs[str(key)], rng)
    out = _copy(answer)
    out[t][i] = _render(call.name, tuple(args), kwargs)
    return out


def _has_args(text: str) -> bool:
    call = parse_call(text)
    return bool(call.args or call.kwargs)


def _swap(answer: Answer, rng: random.Random, entry: Entry) -> Answer | None:
    spots = [(t, i) for t, i in _calls(answer) if i + 1 < len(answer[t])]
    spots = [(t, i) for t, i in spots if answer[t][i] != answer[t][i + 1]]
    if not spots:
        return None
    t, i = rng.choice(spots)
    out = _copy(answer)
    out[t][i], out[t][i + 1] = out[t][i + 1], out[t][i]
    return out


def _repeat(answer: Answer, rng: random.Random, entry: Entry) -> Answer | None:
    spots = _calls(answer)
    if not spots:
        return None
    t, i = rng.choice(spots)
    out = _copy(answer)
    out[t].insert(i, out[t][i])
    return out


def _move_early(answer: Answer, rng: random.Random, entry: Entry) -> Answer | None:
    spots = [t for t in range(1, len(answer)) if answer[t]]
    if not spots:
        return None
    t = rng.choice(spots)
    out = _copy(answer)
    out[t - 1].append(out[t].pop(0))
    return out


def _rename(answer: Answer, rng: random.Random, entry: Entry) -> Answer | None:
    names = [doc["name"] for cls in entry.classes for doc in function_docs(cls)]
    spots = _calls(answer)
    if not spots or len(names) < 2:
        return None
    t, i = rng.choice(spots)
    call = parse_call(answer[t][i])
    other = rng.choice([n for n in names if n != call.name])
    out = _copy(answer)
    out[t][i] = _render(other, call.args, call.kwargs)
    return out


def _extra_read(answer: Answer, rng: random.Random, entry: Entry) -> Answer | None:
    reads = {"GorillaFileSystem": "pwd()", "MathAPI": "absolute_value(number=-3)"}
    found = [reads[c] for c in entry.classes if c in reads]
    turns = [t for t, turn in enumerate(answer) if turn]
    if not found or not turns:
        return None
    out = _copy(answer)
    out[rng.choice(turns)].insert(0, rng.choice(found))
    return out


PERTURBATIONS: dict[str, Callable[[Answer, random.Random, Entry], Answer | None]] = {
    "drop_call": _drop_call,
    "empty_turn": _empty_turn,
    "mutate_arg": _mutate_arg,
    "swap": _swap,
    "repeat": _repeat,
    "move_early": _move_early,
    "rename": _rename,
    "extra_read": _extra_read,
}


def cases(n_perturbed: int, seed: int = 0, gold: bool = True) -> list[Case]:
    """Every entry's gold answer (with `gold`) and `n_perturbed` perturbed answers, the
    entries and perturbations taken in turn, in an order fixed by `seed`."""
    rng = random.Random(seed)
    entries = [e for category in CATEGORIES for e in load_category(category)]
    out = [Case(e, "gold", e.answer) for e in entries] if gold else []
    kinds = list(PERTURBATIONS)
    order = entries[:]
    rng.shuffle(order)
    attempt = 0
    made = 0
    while made < n_perturbed and attempt < n_perturbed * 10:
        entry = order[attempt % len(order)]
        kind = kinds[attempt % len(kinds)]
        attempt += 1
        answer = PERTURBATIONS[kind](entry.answer, rng, entry)
        if answer is not None and answer != entry.answer:
            out.append(Case(entry, kind, answer))
            made += 1
    return out


async def ours(case: Case) -> tuple[bool, str]:
    """Our verdict: the calls through the task's real registry and runtime, then `check`."""
    from conveyor.tasks.bfcl import BfclRegistry, SimulatorTool
    from conveyor.tasks.bfcl.data import named_arguments, owner_of

    entry = case.entry
    runtime = BfclRuntime(entry)
    registry = BfclRegistry(
        SimulatorTool(doc) for cls in entry.classes for doc in function_docs(cls)
    )
    task = Task(id=entry.id, family="bfcl", prompt=[], data=entry.to_data())
    ctx = ToolContext(task=task, runtime=runtime)
    steps = []
    for t, turn in enumerate(case.answer):
        for text in turn:
            call = parse_call(text)
            try:
                arguments = named_arguments(owner_of(call.name, entry.classes), call)
            except (TypeError, KeyError):  # a model names its arguments: positions dropped
                arguments = dict(call.kwargs)
            await registry.execute(
                ToolCall(name=call.name, arguments=arguments),
                ctx,
                timeout_s=60.0,
                max_output_chars=10**9,
            )
        steps.append(len(turn))
        if t < len(case.answer) - 1:
            runtime.end_turn()
    runtime.end_turn()
    verdict = check(entry, runtime, steps, 10**6)
    return verdict.valid, verdict.error_type


def upstream(case: Case) -> tuple[bool, str]:
    """BFCL's verdict: `multi_turn_checker` on the answer's call strings, one a step."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    entry = case.entry
    name = f"parity_{uuid.uuid4().hex}"
    test_entry = {
        "id": entry.id,
        "initial_config": entry.initial_config,
        "involved_classes": entry.classes,
    }
    steps = [[[text] for text in turn] for turn in case.answer]
    try:
        result = multi_turn_checker(steps, entry.answer, test_entry, "", name)
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            del vars(multi_turn_utils)[key]
    return bool(result["valid"]), "" if result["valid"] else str(result.get("error_type", ""))


def compare(chosen: list[Case]) -> dict[str, Any]:
    """Both verdicts on every case; a JSON-ready report with the disagreements."""
    agree = 0
    by_kind: dict[str, dict[str, int]] = {}
    mismatches: list[dict[str, Any]] = []
    for case in chosen:
        mine = asyncio.run(ours(case))
        theirs = upstream(case)
        same = mine[0] == theirs[0] and (mine[0] or mine[1] == theirs[1])
        row = by_kind.setdefault(case.kind, {"n": 0, "agree": 0, "upstream_valid": 0})
        row["n"] += 1
        row["agree"] += int(same)
        row["upstream_valid"] += int(theirs[0])
        agree += int(same)
        if not same:
            mismatches.append(
                {"id": case.entry.id, "kind": case.kind, "ours": mine, "upstream": theirs}
            )
    return {
        "scorer": "bfcl multi_turn_checker",
        "cases": len(chosen),
        "agree": agree,
        "by_kind": by_kind,
        "mismatches": mismatches[:50],
        "ok": agree == len(chosen),
    }


def run_parity(n_perturbed: int, seed: int = 0) -> dict[str, Any]:
    """`conveyor tasks parity bfcl`: every entry's gold answer and `n_perturbed` perturbed."""
    return compare(cases(n_perturbed, seed))
