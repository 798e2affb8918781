"""Memory agent (MemAgent style): answer a question about a document far longer than the context
window, read one chunk at a time through a bounded memory.

Each context the agent sees holds the system prompt, the question, its memory (text it wrote) and
one chunk of the document. It calls `update_memory(text)`: the memory is replaced (at most
`memory_chars` characters; a longer one is the policy's tool error and the context stays), and
the loop drops the history (`ToolContext.reset_context`) and opens the next context with the next
chunk and the new memory. After the last chunk the context asks for the answer: `finish(answer)`.
Each context is its own training sample (counted in `counters["resets"]`, not as a template
split) and every sample takes the trajectory's advantage, from the final answer alone.

The reading position and the memory live in the rollout's runtime (a `SimulatedRuntime` file
written only by `update_memory`; the policy has no tool that writes files), so the grader knows
how far the agent read. Reward: the normalised answer equals the expected one exactly, and the
agent had been shown every chunk the answer rests on (a lucky guess before reading scores 0).

Options (`tasks.options.memory`, see `MemoryOptions`): `chunks` (a number, or `[low, high]`),
`chunk_tokens`, `memory_chars`. The loop needs `agent.max_turns` of at least the chunk count
plus one (one turn per chunk and one to answer): see docs/domains/memory.md.
"""

from __future__ import annotations

import json
import random
import string
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from conveyor.agent.loop import final_answer
from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import RESET_KEY, ToolContext, ToolRegistry, finish, tool
from conveyor.config import RuntimeConfig
from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.runtime.selection import RuntimeRequest, start_runtime
from conveyor.runtime.simulated import SimulatedRuntime
from conveyor.tasks.family import (
    FamilyServices,
    Grade,
    family_options,
    instance_task,
    register_family,
    runtime_choice,
    sample_instances,
)
from conveyor.tasks.memory.document import Document, DocumentSpec, draw_spec, render
from conveyor.types import Message, Task, ToolCall, Trajectory

# Where `update_memory` keeps the reading position and the memory inside the runtime.
STATE_PATH = f"{SimulatedRuntime.root}/.reader/state.json"
# The memory shown before the first update.
EMPTY_MEMORY = "(empty)"


class MemoryOptions(BaseModel):
    """`tasks.options.memory`.

    - `chunks`: chunks per document, a number or `[low, high]` (each document draws its count);
    - `chunk_tokens`: about how many tokens one chunk holds (SmolLM2 tokenizer);
    - `memory_chars`: the most characters `update_memory` keeps; the default fits a memory and
      its tool-call wrapper in the default `agent.max_completion_tokens` (256).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    chunks: int | tuple[int, int] = Field(default=(48, 64))
    chunk_tokens: int = Field(default=400, ge=50, le=4000)
    memory_chars: int = Field(default=512, ge=200, le=16000)

    @field_validator("chunks")
    @classmethod
    def _chunks_in_range(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
        low, high = (value, value) if isinstance(value, int) else value
        if not 6 <= low <= high <= 1000:
            raise ValueError(f"chunks must lie in 6..1000 with low <= high, got {value}")
        return value

    def chunk_range(self) -> tuple[int, int]:
        """`chunks` as an inclusive `(low, high)`."""
        return (self.chunks, self.chunks) if isinstance(self.chunks, int) else self.chunks


def _system_prompt(memory_chars: int) -> str:
    update = format_tool_call(
        ToolCall(
            name="update_memory",
            arguments={"text": "Day 2: Courier Ada Ivel was posted to the Duskmere depot."},
        ),
        "hermes",
    )
    done = format_tool_call(ToolCall(name="finish", arguments={"answer": "Duskmere"}), "hermes")
    return (
        "You answer a question about a long document that you read one chunk at a time. "
        "Each message shows the question, your memory and the next chunk; earlier chunks are "
        "gone, so write down in your memory every fact that may help answer the question. "
        f"Call update_memory with your whole new memory (at most {memory_chars} characters); "
        "the next chunk follows. Call a tool exactly like this:\n"
        f"{update}\n"
        "After the last chunk, submit only the answer:\n"
        f"{done}"
    )


def _context(data: dict[str, Any], position: int, memory: str) -> list[Message]:
    """The messages of the context that shows chunk `position` of a task (its `data`), or asks
    for the answer when every chunk has been read, with `memory`."""
    chunks: list[str] = data["chunks"]
    parts = [
        f"Question: {data['question']}",
        f"Your memory:\n{memory or EMPTY_MEMORY}",
    ]
    if position < len(chunks):
        parts.append(f"Chunk {position + 1} of {len(chunks)}:\n{chunks[position]}")
        parts.append("Update your memory with update_memory.")
    else:
        parts.append(
            f"You have read all {len(chunks)} chunks. Answer the question now with finish."
        )
    return [
        {"role": "system", "content": _system_prompt(data["memory_chars"])},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _runtime(ctx: ToolContext) -> Runtime:
    if ctx.runtime is None:
        raise RuntimeFailure("the memory tools need a runtime, and this rollout has none")
    return ctx.runtime


async def read_state(runtime: Runtime) -> dict[str, Any]:
    """`{"position", "memory"}`: the chunk on show (the chunk count once all are read) and the
    current memory."""
    state: dict[str, Any] = json.loads(await runtime.read_file(STATE_PATH))
    return state


@tool
async def update_memory(text: str, ctx: ToolContext) -> str:
    """Replace your memory with `text` and move on to the next chunk.

    Args:
        text: Your whole new memory: the facts you need for the question.
    """
    runtime = _runtime(ctx)
    state = await read_state(runtime)
    chunks = len(ctx.task.data["chunks"])
    limit = int(ctx.task.data["memory_chars"])
    if RESET_KEY in ctx.state:
        raise ValueError("the memory was already updated in this turn; the next chunk follows")
    if state["position"] >= chunks:
        raise ValueError(f"all {chunks} chunks are read: answer the question with finish")
    if len(text) > limit:
        raise ValueError(
            f"the memory is {len(text)} characters, over the bound of {limit}; "
            "shorten it and call update_memory again"
        )
    position = state["position"] + 1
    await runtime.write_file(STATE_PATH, json.dumps({"position": position, "memory": text}))
    ctx.reset_context(_context(ctx.task.data, position, text))
    upcoming = f"chunk {position + 1} of {chunks} follows" if position < chunks else "answer next"
    return f"Memory saved ({len(text)} of {limit} characters); {upcoming}."


def normalise(text: str) -> str:
    """Lower case, punctuation turned into spaces, the articles a/an/the dropped, whitespace
    collapsed."""
    lowered = text.lower().translate(
        str.maketrans(string.punctuation, " " * len(string.punctuation))
    )
    return " ".join(w for w in lowered.split() if w not in {"a", "an", "the"})


@register_family(options=MemoryOptions)
class MemoryFamily:
    """Read a generated expedition log chunk by chunk through a bounded memory; tools:
    `update_memory` and `finish`.

    `Task.data` holds `question`, `answer`, `kind` (`transfer` or `sum`), `chunks` (the texts),
    `memory_chars`, `needed` (`[{"chunk", "text"}]`: the facts the answer rests on, earliest
    first) and `distractors` (wrong answers of the same kind that the log supports).
    """

    name = "memory"
    splits = ("train", "eval", "test")
    source = "generated (fictional expedition logs)"
    version = "1"
    runtimes: tuple[str, ...] = ("simulated",)

    def __init__(
        self, runtime: RuntimeConfig | None = None, services: FamilyServices | None = None
    ) -> None:
        self.runtime, self.runtime_kind = runtime_choice(self.name, runtime, self.runtimes)
        given = services.options if services is not None else {}
        self.options = family_options(self.name, MemoryOptions, given)

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct documents and questions of `split`, deterministic in the arguments and
        the options."""
        low, high = self.options.chunk_range()
        chunk_tokens = self.options.chunk_tokens

        def draw(rng: random.Random) -> tuple[str, DocumentSpec]:
            # the text is written only for the specs kept (most draws hash to another split)
            spec = draw_spec(rng, rng.randint(low, high), chunk_tokens)
            return spec.key(), spec

        specs = sample_instances(self.name, n, seed, split, draw)
        datas = (_data(render(spec), self.options.memory_chars) for spec in specs)
        return [
            instance_task(self.name, split, index, _context(data, 0, ""), data)
            for index, data in enumerate(datas)
        ]

    def tools(self) -> ToolRegistry:
        """`update_memory` and `finish`."""
        return ToolRegistry([update_memory, finish])

    async def make_runtime(self, task: Task) -> Runtime:
        """A started runtime holding the reading state: chunk 0 on show, an empty memory."""
        state = json.dumps({"position": 0, "memory": ""})
        request = RuntimeRequest(files={STATE_PATH: state})
        return await start_runtime(self.runtime_kind, request, self.runtime)

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """1.0 when the answer is right and every chunk it rests on was shown, else 0.0."""
        exact, read = await self._parts(task, answer, runtime)
        return exact * read

    async def grade(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Grade:
        """`score`, with the parts: `exact_match`, `read_needed` (every needed chunk shown) and
        `chunks_read` (the share of the document shown)."""
        exact, read = await self._parts(task, final_answer(trajectory), runtime)
        position = (await read_state(runtime))["position"]
        shown = min(position + 1, len(task.data["chunks"])) / len(task.data["chunks"])
        breakdown = {"exact_match": exact, "read_needed": read, "chunks_read": shown}
        return Grade(reward=exact * read, breakdown=breakdown)

    async def _parts(self, task: Task, answer: str | None, runtime: Runtime) -> tuple[float, float]:
        position = (await read_state(runtime))["position"]
        last_needed = max(fact["chunk"] for fact in task.data["needed"])
        read = 1.0 if position >= last_needed else 0.0
        if answer is None:
            return 0.0, read
        exact = 1.0 if normalise(answer) == normalise(task.data["answer"]) else 0.0
        return exact, read

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """At each chunk keep the needed facts seen so far, then submit the answer."""
        return [
            *(
                ToolCall(name="update_memory", arguments={"text": oracle_memory(task, position)})
                for position in range(len(task.data["chunks"]))
            ),
            ToolCall(name="finish", arguments={"answer": task.data["answer"]}),
        ]


def oracle_memory(task: Task, position: int) -> str:
    """The oracle's memory after reading chunks 0..`position`: each needed fact seen so far,
    with its day."""
    seen = [fact for fact in task.data["needed"] if fact["chunk"] <= position]
    if not seen:
        return "Nothing relevant yet."
    return " ".join(f"Day {fact['chunk'] + 1}: {fact['text']}" for fact in seen)


def _data(document: Document, memory_chars: int) -> dict[str, Any]:
    return {
        "kind": document.kind,
        "question": document.question,
        "answer": document.answer,
        "chunks": document.chunks,
        "memory_chars": memory_chars,
        "needed": [{"chunk": f.chunk, "text": f.text} for f in document.needed],
        "distractors": document.distractors,
    }
