"""Reasoning Gym's datasets and scorers, used safely: which datasets the `rg` family can use,
and a scorer wrapper that never lets model text reach `eval` or hang the grader.

`reasoning_gym` is imported on first use only (it pulls in sympy, matplotlib and cellpylib:
about 3.5 s), so `import conveyor.tasks.rg` and `conveyor tasks families` stay fast.

What reasoning-gym 0.1.25's scorers were found to do (a survey of all 106 datasets: the oracle,
an empty answer, the question echoed, every candidate listed, the answer padded to 5,000
characters):
- most give partial credit: the base scorer gives len(oracle)/len(answer) when the oracle is a
  substring of the answer, others 0.01-0.05 for any non-empty answer, 0.1-0.5 for a near miss;
- some are lenient: `gsm_symbolic` reads the first number of the answer; `kakurasu`, `survo`,
  `knights_knaves`, `sokoban`, `quantum_lock`, `time_intervals` ignore text around the solution;
- `game_of_life_halting` gives 1.0 to any non-empty text when the answer is "True";
- nine call Python's `eval` (or sympy's `parse_expr`, which evals) on the answer;
- seven have no oracle: their stored answer is one of many solutions (or none), and the scorer
  checks a solution, so the stored answer does not score 1.0;
- some raise on malformed answers (`prime_factorization` on text that is not numbers).
`safe_score` handles each: a length cap, a screen before any eval-based scorer, exceptions as 0.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import functools
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

# The dataset seed and index space every instance is drawn from: entry `i` of dataset `name` is
# always the same (reasoning-gym seeds each entry with `Random(seed + i)`), so an instance is
# fully named by (name, index).
DATASET_SEED = 0
INDEX_SPACE = 10_000

# Datasets the family refuses, with the reason (reasoning-gym 0.1.25).
_NO_ORACLE = (
    "its stored answer is one of many solutions (or none) and does not score 1.0 under its own "
    "scorer, so there is no oracle"
)
_SYMPY_EVAL = "its scorer runs sympy.parse_expr (Python eval) on the model's answer"
REFUSED: Mapping[str, str] = {
    "composite": "it mixes other datasets with its own config; list those datasets instead",
    "game_of_life_halting": (
        "its scorer compares bool(answer) with bool(expected), so any non-empty text scores 1.0 "
        "when the expected answer is True"
    ),
    "arc_agi": _NO_ORACLE,
    "rearc": _NO_ORACLE,
    "boxnet": _NO_ORACLE,
    "graph_color": _NO_ORACLE,
    "propositional_logic": _NO_ORACLE,
    "rubiks_cube": _NO_ORACLE,
    "rush_hour": _NO_ORACLE,
    "simple_integration": _SYMPY_EVAL,
    "intermediate_integration": _SYMPY_EVAL,
    "polynomial_multiplication": _SYMPY_EVAL,
}

# Answers to these datasets' scorers reach `eval`/`parse_expr` unless the screen clears them.
_ARITHMETIC = re.compile(r"[0-9+\-*/()\s]+")
_LITERAL_NODES = (ast.Expression, ast.Constant, ast.List, ast.Tuple, ast.Name, ast.Load)
_SIGN_NODES = (ast.UnaryOp, ast.USub, ast.UAdd)


def _plain_arithmetic(answer: str) -> bool:
    """Numbers, + - * / , parentheses and whitespace, no power (sympy would compute 9**9**9
    exactly)."""
    return _ARITHMETIC.fullmatch(answer) is not None and "**" not in re.sub(r"\s", "", answer)


def _inert_for_eval(answer: str) -> bool:
    """True when `eval(answer)` can do nothing but fail or build a literal: the text is not
    Python at all, or only constants, names, lists, tuples and signs (no calls, attributes,
    subscripts or operators)."""
    try:
        tree = ast.parse(answer.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return True
    return all(isinstance(node, _LITERAL_NODES + _SIGN_NODES) for node in ast.walk(tree))


EVAL_SCREENS: Mapping[str, Callable[[str], bool]] = {
    "countdown": _plain_arithmetic,
    "puzzle24": _plain_arithmetic,
    "binary_matrix": _inert_for_eval,
    "n_queens": _inert_for_eval,
    "spiral_matrix": _inert_for_eval,
    "string_insertion": _inert_for_eval,
}


def _registry() -> Mapping[str, Any]:
    from reasoning_gym.factory import DATASETS

    return DATASETS


def dataset_names() -> list[str]:
    """Every dataset reasoning-gym registers, sorted."""
    return sorted(_registry())


def check_dataset_names(names: list[str]) -> list[str]:
    """`names` if every one is a usable dataset; a `ValueError` naming each unknown one with
    close names, and each refused one with the reason."""
    known = _registry()
    problems: list[str] = []
    for name in names:
        if name in REFUSED:
            problems.append(f"{name!r} cannot be used: {REFUSED[name]}")
        elif name not in known:
            close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(map(repr, close))}?" if close else "no close name"
            problems.append(f"unknown reasoning-gym dataset {name!r} ({hint})")
    if problems:
        raise ValueError(
            "; ".join(problems) + f" (reasoning-gym has {len(known)} datasets: "
            "python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))')"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"datasets are listed more than once: {names}")
    return names


def check_dataset_config(name: str, values: Mapping[str, Any]) -> None:
    """A `ValueError` unless `values` are fields of dataset `name`'s config (not `seed` or
    `size`, which the family sets) that build a valid dataset."""
    config_class = _registry()[name][1]
    fields = {f.name for f in dataclasses.fields(config_class)} - {"seed", "size"}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(
            f"config of {name!r}: unknown fields {', '.join(unknown)} "
            f"(its fields: {', '.join(sorted(fields))})"
        )
    try:
        dataset(name, values)
    except Exception as error:  # the dataset's own validation (assertions, ValueError, ...)
        raise ValueError(f"config of {name!r} is refused by reasoning-gym: {error}") from None


def dataset(
    name: str,
    config: Mapping[str, Any] | None = None,
    *,
    seed: int = DATASET_SEED,
    size: int = INDEX_SPACE,
) -> Any:
    """The reasoning-gym dataset `name` with `seed` (default `DATASET_SEED`), `size` entries
    (default `INDEX_SPACE`) and its default config updated by `config` (built once per process
    for each combination; a benchmark config names its own seed and size)."""
    return _built(name, json.dumps(dict(config or {}), sort_keys=True), seed, size)


@functools.cache
def _built(name: str, config_json: str, seed: int, size: int) -> Any:
    import reasoning_gym

    config = json.loads(config_json)
    return reasoning_gym.create_dataset(name, seed=seed, size=size, **config)


def json_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """`entry` as plain JSON data (tuples become lists, sets sorted lists, other objects their
    text), so it survives `Task` serialisation unchanged."""

    def fallback(value: Any) -> Any:
        if isinstance(value, set | frozenset):
            return sorted(value, key=repr)
        return str(value)

    data: dict[str, Any] = json.loads(json.dumps(dict(entry), default=fallback))
    return data


def max_answer_chars(entry: Mapping[str, Any]) -> int:
    """The longest answer scored: twice the stored answer's length plus 100 characters."""
    return 2 * len(str(entry.get("answer") or "")) + 100


def raw_score(
    name: str,
    answer: str | None,
    entry: Mapping[str, Any],
    config: Mapping[str, Any] | None = None,
    *,
    seed: int = DATASET_SEED,
    size: int = INDEX_SPACE,
) -> float:
    """Dataset `name`'s (built with `config`, `seed`, `size`) own `score_answer` of `answer`
    exactly as given (None for no answer; never stripped, as upstream passes it), clamped to
    [0, 1]; 0.0 when the answer is too long (`max_answer_chars`), refused by the dataset's eval
    screen, or makes the scorer raise. Those three are the only places the value can differ
    from reasoning-gym's own (`conveyor tasks check parity --scorer rg` counts them)."""
    if answer is not None:
        if len(answer) > max_answer_chars(entry):
            return 0.0
        screen = EVAL_SCREENS.get(name)
        if screen is not None and answer.strip() and not screen(answer):
            return 0.0
    try:
        built = dataset(name, config, seed=seed, size=size)
        value = float(built.score_answer(answer, copy.deepcopy(dict(entry))))
    except Exception:  # a scorer raising on malformed text: the answer is wrong, not the run
        return 0.0
    return min(max(value, 0.0), 1.0) if value == value else 0.0
