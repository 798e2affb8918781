"""Your own tasks and reward: a JSONL tasks file, graded by your agent or by your command.

For training an agent you already have (`agent.external_command`, any language, talking to the
recording gateway) on tasks no built-in family holds:

```yaml
tasks:
  families: [usertasks]
  options:
    usertasks:
      path: my_tasks.jsonl           # one task a line
      reward: command                # or "agent": the reward the program sends with finish
      reward_command: [python, grade.py]
agent:
  external_command: [python, my_agent.py]
```

A line of the tasks file: `{"id": "t1", "prompt": "..." | [messages], "data": {...},
"split": "train" | "eval" | "test"}` (`data` optional, `split` default "train"). The prompt is
what `GET /rollouts/ID/task` gives the program (a string becomes one user message).

Rewards fail closed. `reward: agent` takes the reward the program sends with `finish` (none
sent: 0.0); it is for tasks only the program can judge, since the program is the policy.
`reward: command` runs the command (no shell) once per rollout with
`{"task_id", "prompt", "data", "answer"}` as JSON on stdin (`answer`: what the program
submitted, null if nothing) and reads a finite number from the last line of its stdout. A
command that fails, times out (`reward_timeout_s`) or prints no number is an infrastructure
error (`RuntimeFailure`: the rollout is retried and kept out of learning), never a reward.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from conveyor.agent.tools import ToolRegistry, finish
from conveyor.config import RuntimeConfig
from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.runtime.selection import RuntimeRequest, start_runtime
from conveyor.tasks.family import family_options, register_family, runtime_choice, shuffled_pool
from conveyor.types import FamilyServices, Message, Task, ToolCall


class UserTasksOptions(BaseModel):
    """`tasks.options.usertasks`: the tasks file and how its rollouts are rewarded."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(
        default=None,
        description="The JSONL tasks file: one {id, prompt, data?, split?} object a line "
        "(resolved to an absolute path when the config loads; required there).",
    )
    reward: Literal["agent", "command"] = Field(
        default="agent",
        description="'agent': the reward the agent program sends with finish (0.0 if none); "
        "'command': reward_command grades each rollout.",
    )
    reward_command: list[str] | None = Field(
        default=None,
        description="With reward 'command': the grader's argv (no shell); it reads "
        '{"task_id", "prompt", "data", "answer"} as JSON on stdin and prints a number.',
    )
    reward_timeout_s: float = Field(
        default=60.0, gt=0, description="How long reward_command may run per rollout."
    )
    sha256: str | None = Field(
        default=None,
        description="The tasks file's content hash, recorded when the config loads.",
    )

    @field_validator("reward_command")
    @classmethod
    def _argv(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not all(isinstance(a, str) and a for a in value)):
            raise ValueError("reward_command must be a non-empty argv list of strings")
        return value


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=96, pattern=r"^[A-Za-z0-9._:-]+$")
    prompt: str | list[dict[str, Any]]
    data: dict[str, Any] = Field(default_factory=dict)
    split: Literal["train", "eval", "test"] = "train"


def read_tasks(path: Path) -> list[_Line]:
    """The tasks of a file, checked: a `ValueError` naming the line that is wrong."""
    lines: list[_Line] = []
    seen: set[str] = set()
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = _Line.model_validate_json(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(x) for x in e['loc']) or '(line)'}: {e['msg']}"
                for e in exc.errors()
            )
            raise ValueError(f"{path}:{number}: {problems}") from None
        if line.id in seen:
            raise ValueError(f"{path}:{number}: task id {line.id!r} appears twice")
        seen.add(line.id)
        lines.append(line)
    if not lines:
        raise ValueError(f"{path}: no tasks")
    return lines


@register_family(options=UserTasksOptions)
class UserTasksFamily:
    """The tasks of a JSONL file; tools: `finish` only (the agent program brings its own);
    rewarded by the program or by a command."""

    name = "usertasks"
    runtimes: tuple[str, ...] = ("simulated",)
    source = "the user's tasks file (tasks.options.usertasks.path)"

    def __init__(
        self, runtime: RuntimeConfig | None = None, services: FamilyServices | None = None
    ) -> None:
        services = services or FamilyServices()
        self.options = family_options(self.name, UserTasksOptions, services.options)
        if self.options.reward == "command" and not self.options.reward_command:
            raise ValueError("tasks.options.usertasks: reward 'command' needs reward_command")
        self.runtime, self.runtime_kind = runtime_choice(self.name, runtime, self.runtimes)
        self.lines = read_tasks(Path(self.options.path)) if self.options.path else []
        # read by `gateway.external`: the program's finish reward is the reward
        self.reward_from_agent = self.options.reward == "agent"

    @classmethod
    def resolve_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The path made absolute, the file checked and its hash recorded."""
        checked = family_options(cls.name, UserTasksOptions, options)
        if not checked.path:
            raise ValueError("tasks.options.usertasks.path: the tasks file is required")
        path = Path(checked.path).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"tasks.options.usertasks.path: no file {path}")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if checked.sha256 is not None and checked.sha256 != digest:
            raise ValueError(
                f"tasks.options.usertasks.path: {path} changed since the run recorded it "
                f"(sha256 {checked.sha256[:12]}..., now {digest[:12]}...)"
            )
        read_tasks(path)
        if checked.reward == "command" and not checked.reward_command:
            raise ValueError("tasks.options.usertasks: reward 'command' needs reward_command")
        return {**checked.model_dump(), "path": str(path), "sha256": digest}

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` tasks of `split`, shuffled by `seed` (a larger `n` extends a smaller one)."""
        if not self.options.path:
            raise ValueError("usertasks: set tasks.options.usertasks.path (the tasks file)")
        pool = [line for line in self.lines if line.split == split]
        chosen = shuffled_pool(
            self.name,
            pool,
            n,
            seed,
            split,
            lambda have: (
                f"usertasks: {self.options.path} has {have} {split} tasks, {n} asked "
                "(tasks.num_tasks)"
            ),
        )
        return [
            Task(
                id=f"{self.name}-{split}-{line.id}",
                family=self.name,
                prompt=_prompt(line.prompt),
                data=line.data,
                split=split,
            )
            for line in chosen
        ]

    def tools(self) -> ToolRegistry:
        """`finish` (the program's own tools run in the program)."""
        return ToolRegistry([finish])

    async def make_runtime(self, task: Task) -> Runtime:
        """An empty started runtime: the program runs its own environment."""
        return await start_runtime(self.runtime_kind, RuntimeRequest(files={}), self.runtime)

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """The reward command's number; with reward 'agent' 0.0 (only the program's finish
        reward counts, taken by `gateway.external`)."""
        command = self.options.reward_command
        if self.options.reward != "command" or not command:
            return 0.0
        payload = {"task_id": task.id, "prompt": task.prompt, "data": task.data, "answer": answer}
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise RuntimeFailure(
                f"usertasks: reward_command {command} did not start: {exc}"
            ) from exc
        try:
            out, err = await asyncio.wait_for(
                process.communicate(json.dumps(payload).encode()), self.options.reward_timeout_s
            )
        except TimeoutError:
            process.kill()
            await process.wait()
            raise RuntimeFailure(
                f"usertasks: reward_command ran past {self.options.reward_timeout_s}s"
            ) from None
        if process.returncode != 0:
            tail = err.decode(errors="replace")[-400:]
            raise RuntimeFailure(f"usertasks: reward_command exited {process.returncode}: {tail}")
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            reward = float(lines[-1])
        except (IndexError, ValueError):
            raise RuntimeFailure(
                f"usertasks: reward_command printed no number on its last line: {out[-200:]!r}"
            ) from None
        if not math.isfinite(reward):
            raise RuntimeFailure(f"usertasks: reward_command printed {reward}")
        return reward

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """`finish` with `data.answer` (a tasks file may hold one; "" otherwise)."""
        return [ToolCall(name="finish", arguments={"answer": str(task.data.get("answer", ""))})]


def _prompt(prompt: str | list[dict[str, Any]]) -> list[Message]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(message) for message in prompt]
