"""`conveyor tasks families` and `conveyor tasks check`: what families exist, and whether a family's
oracle solves its instances and an empty policy does not.

The check runs the real agent loop, tools, runtime and grader of a family; only the policy is
scripted (`conveyor.trainer.sft.OracleEngine`, the same engine the warm start uses): the oracle
policy emits the family's `oracle_calls` (tool calls, and plain replies for a conversational
family), the empty policy replies with nothing. Hints are off, so a reply without a tool call
ends a non-conversational rollout as the policy's own result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from conveyor.app.compose import Composition
from conveyor.config import AgentConfig, ConveyorConfig
from conveyor.types import Status, Task, ToolCall, Trajectory

EMPTY_REPLY = ""
# The smallest budgets a check gives the oracle's rollouts (tokens).
CHECK_COMPLETION_TOKENS = 2048
CHECK_CONTEXT_TOKENS = 16384


def families_table() -> list[dict[str, Any]]:
    """Every registered family's `{"name", "splits", "source", "version"}`, sorted by name."""
    from conveyor.registry import FAMILIES
    from conveyor.tasks.family import family_info

    return [family_info(name) for name in FAMILIES.names()]


def check_config(config: ConveyorConfig, family: str) -> ConveyorConfig:
    """`config` narrowed to `family` (its options kept), hints off, and room for the oracle's
    longest reply (`CHECK_COMPLETION_TOKENS`: a bfcl answer call is up to ~1,200 tokens, a
    HumanEval solution ~350) and prompt (`CHECK_CONTEXT_TOKENS`): the check is of the family,
    not of the run's budgets."""
    tasks = config.tasks.model_copy(
        update={
            "families": [family],
            "options": {k: v for k, v in config.tasks.options.items() if k == family},
        }
    )
    hints = config.agent.hints.model_copy(update={"enabled": False})
    context = max(config.agent.max_context_tokens, CHECK_CONTEXT_TOKENS)
    agent = config.agent.model_copy(
        update={
            "hints": hints,
            "max_completion_tokens": max(
                config.agent.max_completion_tokens, CHECK_COMPLETION_TOKENS
            ),
            "max_context_tokens": context,
            "max_prompt_tokens": max(config.agent.max_prompt_tokens, context - 256),
        }
    )
    return config.model_copy(update={"tasks": tasks, "agent": agent})


async def scripted_rollouts(
    parts: Composition,
    tasks: Sequence[Task],
    steps: Callable[[Task], list[ToolCall]],
    *,
    concurrency: int = 4,
) -> list[Trajectory]:
    """One rollout per task through the real loop, with a policy that emits `steps(task)`."""
    from conveyor.trainer.sft import OracleEngine, oracle_rollouts

    tokenizer = parts.tokenizer
    engine = OracleEngine(
        {task.id: steps(task) for task in tasks},
        lambda text: tokenizer.encode(text, add_special_tokens=False),
        tokenizer.eos_token_id,
        parts.config.model.tool_format,
    )
    return await oracle_rollouts(
        parts.stages(engine=engine), tasks, concurrency=concurrency, keep_infra_errors=True
    )


async def check_family(
    config: ConveyorConfig,
    family: str,
    *,
    n: int | None = 10,
    split: str | None = "eval",
    concurrency: int = 4,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Oracle and empty rollouts of `n` instances of `family`'s `split`; a JSON-ready report
    whose `ok` says the oracle scored 1.0 and the empty policy 0.0 on every instance. With
    neither `n` nor `split` (None), a family's own check set where it has one (its
    `check_tasks()`, e.g. every terminal task folder), else 10 eval instances."""
    from conveyor.tasks.family import say as say_step

    parts = Composition(check_config(config, family))
    try:
        fam = parts.families[family]
        own = getattr(fam, "check_tasks", None)
        if n is None and split is None and callable(own):
            tasks, split = list(own()), "check set"
        else:
            split = "eval" if split is None else split
            tasks = parts.tasks(10 if n is None else n, split)
        say(f"{family}: {len(tasks)} {split} instances")
        # The turn budgets are the config's own: an oracle path that does not fit them fails
        # the check, so a passing check says the shipped budgets fit (only the token budgets
        # are widened, see `check_config`).
        drop = getattr(fam, "dropped", None)
        dropped: list[str] = list(drop(split)) if callable(drop) else []
        oracle_steps = {t.id: fam.oracle_calls(t) for t in tasks}
        fits = {t.id: oracle_fits(oracle_steps[t.id], parts.config.agent) for t in tasks}
        say(
            f"{family}: the oracle path fits the turn budgets on {sum(fits.values())} of "
            f"{len(tasks)} instances"
        )
        oracle = await scripted_rollouts(
            parts, tasks, lambda t: oracle_steps[t.id], concurrency=concurrency
        )
        empty = await scripted_rollouts(
            parts, tasks, lambda _t: [say_step(EMPTY_REPLY)], concurrency=concurrency
        )
    finally:
        await parts.close()
    problems: list[dict[str, Any]] = []
    infra: list[dict[str, Any]] = []
    for policy, want, rollouts in (("oracle", 1.0, oracle), ("empty", 0.0, empty)):
        for t in rollouts:
            if t.status is Status.INFRA_ERROR:  # counted, not the family's verdict
                infra.append({"policy": policy, "task_id": t.task_id, "error": t.error})
            elif t.reward != want:
                problems.append(
                    {
                        "policy": policy,
                        "task_id": t.task_id,
                        "reward": t.reward,
                        "status": str(t.status),
                        "error": t.error,
                    }
                )
    report = {
        "family": family,
        "split": split,
        "n": len(tasks),
        "oracle_fits_budget": sum(fits.values()),
        "oracle_mean": _mean(t.reward for t in oracle),
        "empty_mean": _mean(t.reward for t in empty),
        "by_category": _by_category(tasks, oracle, empty),
        "dropped": dropped,
        "infra_errors": infra,
        "problems": problems,
        "ok": not problems,
    }
    if dropped:
        say(f"{family}: {len(dropped)} tasks of '{split}' left out: {', '.join(dropped)}")
    for error in infra[:20]:
        say(f"  infra error ({error['policy']}) {error['task_id']}: {error['error']}")
    for problem in problems[:20]:
        say(
            f"  {problem['policy']} {problem['task_id']}: reward {problem['reward']} "
            f"({problem['status']}) {problem['error'] or ''}".rstrip()
        )
    return report


def oracle_fits(steps: Sequence[ToolCall], agent: AgentConfig) -> bool:
    """Whether an oracle path fits `agent.max_turns` (one model turn per step) and, between
    two plain replies (the user turns of a conversational family), the tool-calling steps fit
    `agent.max_steps_per_user_turn`. It counts one context: a family whose tools reset the
    history (memory) gets `max_turns` per context and may fit where this says it does not."""
    from conveyor.tasks.family import SAY

    if len(steps) > agent.max_turns:
        return False
    limit = agent.max_steps_per_user_turn
    run = 0
    for step in steps:
        run = 0 if step.name == SAY else run + 1
        if limit is not None and run > limit:
            return False
    return True


def _by_category(
    tasks: Sequence[Task], oracle: Sequence[Trajectory], empty: Sequence[Trajectory]
) -> dict[str, dict[str, Any]]:
    """Per `Task.data["category"]` (a benchmark's own grouping, such as BFCL's), the count and
    both policies' mean reward; empty for a family without categories."""
    category = {t.id: str(t.data["category"]) for t in tasks if "category" in t.data}
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(category.values())):
        out[name] = {
            "n": sum(1 for c in category.values() if c == name),
            "oracle_mean": _mean(t.reward for t in oracle if category.get(t.task_id) == name),
            "empty_mean": _mean(t.reward for t in empty if category.get(t.task_id) == name),
        }
    return out


def _mean(values: Any) -> float | None:
    got = [float(v) for v in values if v is not None]
    return sum(got) / len(got) if got else None


def run_check(
    config: ConveyorConfig, family: str, n: int | None, split: str | None
) -> dict[str, Any]:
    """`check_family` from synchronous code (the CLI)."""
    return asyncio.run(check_family(config, family, n=n, split=split))
