"""A task family added from outside the package: repeat a word through `finish`.

One file plus a registration (`@register_family`); a config names it once this module is listed
under `plugins:`. Its tasks are easy enough that the embedded model solves some of them.
"""

from __future__ import annotations

import random

from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import ToolRegistry, finish
from conveyor.runtime.base import Runtime
from conveyor.runtime.simulated import SimulatedRuntime
from conveyor.tasks.family import register_family, sample_instances, task_id
from conveyor.types import Task, ToolCall

WORDS = [f"{a}{b}" for a in ("red", "blue", "green", "gold", "gray") for b in ("fox", "owl", "cat")]


@register_family
class EchoFamily:
    """Say a given word back through `finish`; the reward is 1 when it is that word."""

    name = "echo"

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct words of `split`."""

        def draw(rng: random.Random) -> tuple[str, str]:
            word = f"{rng.choice(WORDS)}{rng.randrange(100)}"
            return word, word

        example = format_tool_call(ToolCall(name="finish", arguments={"answer": "word"}), "hermes")
        return [
            Task(
                id=task_id(self.name, split, index),
                family=self.name,
                prompt=[
                    {"role": "system", "content": f"Answer with a tool call:\n{example}"},
                    {"role": "user", "content": f"Submit the word {word} with finish."},
                ],
                data={"word": word},
                split=split,
            )
            for index, word in enumerate(sample_instances(self.name, n, seed, split, draw))
        ]

    def tools(self) -> ToolRegistry:
        """Only `finish`."""
        return ToolRegistry([finish])

    async def make_runtime(self, task: Task) -> Runtime:
        """No environment is needed."""
        runtime = SimulatedRuntime()
        await runtime.start()
        return runtime

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """1.0 for exactly the word."""
        return 1.0 if (answer or "").strip() == task.data["word"] else 0.0

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """`finish` with the word."""
        return [ToolCall(name="finish", arguments={"answer": task.data["word"]})]
