"""Deep research over a generated encyclopedia (Search-R1 / BrowseComp-Plus style).

The corpus (`conveyor.tasks.search.corpus`) holds about 3,300 pages on fictional people, towns,
rivers, provinces, companies and products whose invented names no pre-trained model can know. A
question (`conveyor.tasks.search.questions`) names one entity and chains 2-4 hops of relations
from it ("In which town was the founder of the company that makes the Skidrein kettle born?"); the
agent finds each page with `search` (BM25 over the corpus, `bm25s`), reads it with `open` and
submits the answer with `finish`.

Reward (`conveyor.tasks.search.grading`): normalised exact match against the answer or an alias.
With the option `judge: true` a judge model (`tasks.judge_engine`) may also accept a short
answer that names the gold entity and nothing else (a surname, "the town of Trusskeind"); the
judge never sees, so can never reward, an answer that lists names, echoes the question or holds
no gold name. The reward is exact match OR (gate passed AND verdict CORRECT).

Options (`tasks.options.search`):
- `judge` (bool, default false): ask the judge when exact match fails; refused at build time
  when no `tasks.judge_engine` is configured.
- `min_hops`, `max_hops` (2-4, default 2 and 4): the range of hop counts drawn, each count
  equally likely (a curriculum; a question of h hops needs 2h+1 tool calls, so `max_hops: 3`
  fits the default `agent.max_turns` of 8).
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any, Self

import bm25s
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from conveyor.agent.loop import final_answer
from conveyor.agent.parsing import format_tool_call
from conveyor.agent.tools import ToolRegistry, finish, tool
from conveyor.config import RuntimeConfig
from conveyor.runtime.base import Runtime
from conveyor.runtime.selection import RuntimeRequest, start_runtime
from conveyor.tasks.family import (
    FamilyServices,
    Grade,
    family_options,
    instance_task,
    opening,
    register_family,
    runtime_choice,
    sample_instances,
)
from conveyor.tasks.search.corpus import CORPUS_SEED, CORPUS_VERSION, corpus
from conveyor.tasks.search.grading import (
    exact_match,
    judge_gate,
    judge_prompt,
    parse_verdict,
)
from conveyor.tasks.search.questions import MAX_HOPS, MIN_HOPS, Question, draw_question
from conveyor.types import Message, Task, ToolCall, Trajectory

MAX_K = 10
MAX_QUERY_CHARS = 300
SNIPPET_CHARS = 160


class _Index:
    """BM25 over every page (title and text), with the page ids in index order."""

    def __init__(self) -> None:
        pages = corpus().documents
        self.ids = list(pages)
        texts = [f"{page.title}. {page.text}" for page in pages.values()]
        self.retriever = bm25s.BM25()
        self.retriever.index(_tokens(texts), show_progress=False)

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        """The `k` best page ids for `query` with their scores; only pages that match at all."""
        words = _tokens([query])[0]
        if not words:
            return []
        scores = self.retriever.get_scores(words)
        best = np.argsort(-scores, kind="stable")[:k]
        return [(self.ids[i], float(scores[i])) for i in best if scores[i] > 0]


def _tokens(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)  # type: ignore[no-any-return]


@cache
def index() -> _Index:
    """The BM25 index of the corpus, built once per process."""
    return _Index()


@tool
async def search(query: str, k: int = 5) -> str:
    """Search the encyclopedia. Returns the best pages: one per line, id, title and the start of
    the page.

    Args:
        query: What to look for, for example a name.
        k: How many pages to return, 1 to 10.
    """
    if not query.strip():
        raise ValueError("query is empty; search for a name or words from the question")
    if len(query) > MAX_QUERY_CHARS:
        raise ValueError(f"query is {len(query)} characters long; at most {MAX_QUERY_CHARS}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be between 1 and {MAX_K}, got {k}")
    hits = index().search(query, k)
    if not hits:
        return f"No page matches {query!r}."
    pages = corpus().documents
    lines = []
    for doc_id, _score in hits:
        page = pages[doc_id]
        snippet = page.text
        if len(snippet) > SNIPPET_CHARS:
            snippet = snippet[:SNIPPET_CHARS].rsplit(" ", 1)[0] + " ..."
        lines.append(f"{doc_id} | {page.title} | {snippet}")
    return "\n".join(lines)


@tool(name="open")
async def open_page(doc_id: str) -> str:
    """Open one page of the encyclopedia and read all of it.

    Args:
        doc_id: The page id as search shows it, for example "person-0042".
    """
    page = corpus().documents.get(doc_id.strip())
    if page is None:
        raise LookupError(f"no page has the id {doc_id!r}; use an id from the search results")
    return f"{page.title}\n\n{page.text}"


def _system_prompt() -> str:
    example = format_tool_call(
        ToolCall(name="search", arguments={"query": "Vaxel lamp", "k": 5}), "hermes"
    )
    read = format_tool_call(ToolCall(name="open", arguments={"doc_id": "product-0042"}), "hermes")
    done = format_tool_call(ToolCall(name="finish", arguments={"answer": "Oxbrin"}), "hermes")
    return (
        "You answer questions about a fictional encyclopedia; you cannot know the answer "
        "without reading it. Find a page with search, read it with open, follow each fact to "
        "the next page, and so on until you reach the answer. Make one call per message and "
        "wait for the result. Call a tool exactly like this:\n"
        f"{example}\n"
        "Open a page by its id:\n"
        f"{read}\n"
        "When you know the answer, submit only the name or value, nothing else:\n"
        f"{done}"
    )


SYSTEM_PROMPT = _system_prompt()


class SearchOptions(BaseModel):
    """`tasks.options.search` (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    judge: bool = False
    min_hops: int = Field(default=MIN_HOPS, ge=MIN_HOPS, le=MAX_HOPS)
    max_hops: int = Field(default=MAX_HOPS, ge=MIN_HOPS, le=MAX_HOPS)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min_hops > self.max_hops:
            raise ValueError(f"min_hops ({self.min_hops}) exceeds max_hops ({self.max_hops})")
        return self


@register_family(options=SearchOptions)
class SearchFamily:
    """Multi-hop questions over a generated encyclopedia; tools `search`, `open` and `finish`.

    `Task.data` holds `question`, `answer`, `aliases`, `answer_entity` (None when a value is
    asked), `attribute`, `hops`, `path` (the page ids to read, in order), `relations` and
    `corpus` (seed and version of the encyclopedia).
    """

    name = "search"
    source = f"generated encyclopedia (seed {CORPUS_SEED})"
    version = CORPUS_VERSION
    splits = ("train", "eval", "test")
    runtimes: tuple[str, ...] = ("simulated",)

    def __init__(
        self, runtime: RuntimeConfig | None = None, services: FamilyServices | None = None
    ) -> None:
        self.runtime, self.runtime_kind = runtime_choice(self.name, runtime, self.runtimes)
        self.services = services if services is not None else FamilyServices()
        self.options = family_options(self.name, SearchOptions, self.services.options)
        if self.options.judge and self.services.judge is None:
            raise ValueError(
                "tasks.options.search.judge is true, but no judge model is configured: "
                "set tasks.judge_engine"
            )

    def make_tasks(self, n: int, seed: int, split: str) -> list[Task]:
        """`n` distinct questions of `split`, deterministic in (n, seed, split)."""
        encyclopedia = corpus()
        hops = (self.options.min_hops, self.options.max_hops)

        def draw(rng: random.Random) -> tuple[str, Question]:
            while True:  # a draw may hit a dead end or a cycle; most do not
                question = draw_question(rng, encyclopedia, hops)
                if question is not None:
                    return question.key, question

        questions = sample_instances(self.name, n, seed, split, draw)
        return [
            instance_task(
                self.name, split, index, opening(SYSTEM_PROMPT, question.text), _data(question)
            )
            for index, question in enumerate(questions)
        ]

    def tools(self) -> ToolRegistry:
        """`search`, `open` and `finish`."""
        return ToolRegistry([search, open_page, finish])

    async def make_runtime(self, task: Task) -> Runtime:
        """An empty started runtime: the tools read the in-process corpus, whose BM25 index is
        built here, in the init stage, the first time (not in the first rollout's tool call)."""
        index()
        return await start_runtime(self.runtime_kind, RuntimeRequest(files={}), self.runtime)

    async def score(self, task: Task, answer: str | None, runtime: Runtime) -> float:
        """1.0 if `answer` normalises to the answer or an alias, else 0.0 (no judge)."""
        return 1.0 if exact_match(answer, task.data) else 0.0

    async def grade(self, task: Task, trajectory: Trajectory, runtime: Runtime) -> Grade:
        """Exact match; with the judge on, a gated judge verdict may accept a near miss.

        The breakdown has the same keys in every rollout of a run: `exact_match`, and with the
        judge on `judge` (1.0 when the judge's verdict turned a miss into a hit) and
        `judge_asked` (whether it was asked: never for an exact match or a gated answer)."""
        answer = final_answer(trajectory)
        matched = exact_match(answer, task.data)
        if not self.options.judge:
            return Grade(reward=float(matched), breakdown={"exact_match": float(matched)})
        unasked = {"exact_match": float(matched), "judge": 0.0, "judge_asked": 0.0}
        if matched or answer is None or judge_gate(answer, task.data, corpus()) is not None:
            return Grade(reward=float(matched), breakdown=unasked)
        assert self.services.judge is not None  # checked when the family was built
        prompt = judge_prompt(task.data["question"], answer, task.data)
        verdict = await self.services.judge().reply(prompt)
        accepted = parse_verdict(verdict) is True
        records: list[Message] = [
            {"role": "judge_prompt", "content": "\n\n".join(m["content"] for m in prompt)},
            {"role": "judge_verdict", "content": verdict},
        ]
        return Grade(
            reward=float(accepted),
            breakdown={**unasked, "judge": float(accepted), "judge_asked": 1.0},
            records=records,
        )

    def oracle_calls(self, task: Task) -> list[ToolCall]:
        """For each page on the path: search its title, open it; then submit the answer."""
        calls: list[ToolCall] = []
        for doc_id, query in zip(task.data["path"], task.data["queries"], strict=True):
            calls.append(ToolCall(name="search", arguments={"query": query, "k": 5}))
            calls.append(ToolCall(name="open", arguments={"doc_id": doc_id}))
        calls.append(ToolCall(name="finish", arguments={"answer": task.data["answer"]}))
        return calls


def _data(question: Question) -> dict[str, Any]:
    pages = corpus().documents
    return {
        "question": question.text,
        "answer": question.answer,
        "aliases": list(question.aliases),
        "answer_entity": question.answer_entity,
        "attribute": question.attribute,
        "hops": question.hops,
        "path": list(question.path),
        "queries": [pages[doc_id].title for doc_id in question.path],
        "relations": list(question.relations),
        "corpus": {"seed": CORPUS_SEED, "version": CORPUS_VERSION},
    }
