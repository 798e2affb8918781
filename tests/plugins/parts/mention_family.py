"""A task family added from outside the package, graded in a bubblewrap sandbox: say a word.

The reward is 1 when the word appears, as a whole word, in anything the model wrote; the check
is `grep` run inside the rollout's own sandbox (the executor's bubblewrap runtime), so on a Ray
cluster it runs on the sandbox node. The embedded model, asked at temperature 1, says the word
in some samples and not in others, which is what a test of the trainer needs: groups with
reward variance from the untrained model (tests/app/test_cluster.py).
"""

from __future__ import annotations

import random
import shlex

from conveyor.agent.tools import ToolRegistry, finish
from conveyor.config import RuntimeConfig
from conveyor.runtime.base import Runtime
from conveyor.tasks.executor import start_executor_runtime
from conveyor.tasks.family import Grade, register_family, sample_instances, task_id
from conveyor.types import Task, ToolCall, Trajectory

WORDS = ["harbor", "violet", "pepper", "canyon", "lantern", "meadow", "copper", "falcon"]
ASKS = [
    "Write one short sentence about a {word}.",
    "Use the word {word} in a sentence.",
    "Describe a {word} in a few words.",
    "Tell me one fact about a {word}.",
]


@register_family
class MentionFamily:
    """Write a sentence with a given word; graded by `grep -w` in the rollout's sandbox."""

    name = "mention"
    runtimes: tuple[str, ...] = ("bubblewrap",)

    def __init__(self, runtime: RuntimeConfig | None = None) -> None:
        self.runtime = runtime if runtime is not None else RuntimeConfig()

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct words of `split`."""

        def draw(rng: random.Random) -> tuple[str, tuple[str, str]]:
            word = rng.choice(WORDS)
            ask = rng.choice(ASKS).format(word=word)
            return ask, (ask, word)

        return [
            Task(
                id=task_id(self.name, split, index),
                family=self.name,
                prompt=[{"role": "user", "content": ask}],
                data={"word": word},
                split=split,
            )
            for index, (ask, word) in enumerate(sample_instances(self.name, n, seed, split, draw))
        ]

    def tools(self) -> ToolRegistry:
        """Only `finish`."""
        return ToolRegistry([finish])

    async def make_runtime(self, task: Task) -> Runtime:
        """A started bubblewrap sandbox over an empty workspace."""
        return await start_executor_runtime(self.runtime)

    async def grade(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Grade:
        """1.0 when the word is in the model's text, checked by `grep -w` in the sandbox."""
        said = "\n".join(
            str(m.get("content") or "") for m in trajectory.messages if m["role"] == "assistant"
        )
        await runtime.write_file("said.txt", said)
        found = await runtime.exec(f"grep -qiw -- {shlex.quote(task.data['word'])} said.txt", 10)
        reward = 1.0 if found.exit_code == 0 else 0.0
        return Grade(reward=reward, breakdown={"mentioned": reward})

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """Unused (`grade` scores the whole conversation)."""
        return 0.0

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """`finish` with a sentence that has the word."""
        sentence = f"The {task.data['word']} is here."
        return [ToolCall(name="finish", arguments={"answer": sentence})]
