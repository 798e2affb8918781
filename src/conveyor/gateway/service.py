"""The gateway without HTTP: rollouts, chat turns recorded token-exact, tools, finish.

A chat request is rendered with our `ChatRenderer` (the request's tools, the model's template,
`model.tool_format` / `model.tool_prompt`) and advanced on the rollout's `TokenLedger`, reusing
the sampled ids or counting a split (`conversation`). Assistant messages are recorded with the
RAW sampled text, exactly as the native loop records them, so a gateway trajectory trains like
a native one.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from conveyor.agent.chat import ChatRenderer, RendererFactory, TokenLedger, renderer_factory
from conveyor.agent.loop import request_seed
from conveyor.agent.parsing import parse_tool_calls
from conveyor.agent.tools import ToolContext
from conveyor.config import AgentConfig, ConveyorConfig, RuntimeConfig, SamplingConfig
from conveyor.engines.base import (
    EngineDown,
    EngineError,
    OutputFormat,
    SampleRequest,
    SampleResult,
    SamplingClient,
    StructuredOutput,
    TopLogprobs,
)
from conveyor.gateway.chat_request import (
    ChatRequest,
    normal_message,
    parse_chat_request,
)
from conveyor.gateway.controls import (
    forced_prefix,
    kept_before_stop,
    stop_strings,
    tool_call_open,
)
from conveyor.gateway.conversation import advance, internal_messages
from conveyor.gateway.errors import (
    GatewayError,
    bad_request,
    conflict,
    context_length_exceeded,
    not_found,
)
from conveyor.gateway.recording import Fork, LastTurn, RolloutRecord, RolloutState
from conveyor.gateway.responses import chat_body, response_object
from conveyor.runtime.base import Runtime, RuntimeFailure
from conveyor.runtime.starts import RuntimeStarts
from conveyor.tasks.family import TaskFamily, get_family
from conveyor.types import EndReason, Status, StopReason, Task, ToolCall, Trajectory, Turn

_ROLLOUT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class Gateway:
    """Rollouts recorded over one `SamplingClient`."""

    def __init__(
        self,
        client: SamplingClient,
        make_renderer: RendererFactory,
        agent: AgentConfig,
        sampling: SamplingConfig,
        *,
        families: Mapping[str, TaskFamily] | None = None,
        tasks: Mapping[str, Task] | None = None,
        run_dir: Path | None = None,
        model_name: str = "conveyor",
        starts: RuntimeStarts | None = None,
    ) -> None:
        """`tasks`: the tasks `POST /rollouts {"task_id"}` may name; `run_dir`: where finished
        trajectories are appended (`trajectories.jsonl`), None to keep them in memory only;
        `starts`: the start limits (and warm pool) of the runtimes it starts, closed by
        `close()` (default: the default limits, no pool)."""
        self.client = client
        self.make_renderer = make_renderer
        self.agent = agent
        self.sampling = sampling
        self.families: dict[str, TaskFamily] = dict(families or {})
        self.tasks: dict[str, Task] = dict(tasks or {})
        self.run_dir = run_dir
        self.model_name = model_name
        self.rollouts: dict[str, RolloutRecord] = {}
        self.starts = starts if starts is not None else RuntimeStarts(RuntimeConfig(warm_pool=0))
        self._renderers: dict[str, ChatRenderer] = {}
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_config(
        cls,
        config: ConveyorConfig,
        client: SamplingClient,
        tokenizer: Any,
        *,
        families: Mapping[str, TaskFamily] | None = None,
        tasks: Mapping[str, Task] | None = None,
        run_dir: Path | None = None,
    ) -> Gateway:
        """A gateway rendering as `AgentStages.from_config` does (template, tool format and
        prompt, budgets and sampling of the run config)."""
        name = config.engine.served_model_name or Path(config.model.path or "conveyor").name
        return cls(
            client,
            renderer_factory(config.model, tokenizer),
            config.agent,
            config.sampling,
            families=families,
            tasks=tasks,
            run_dir=run_dir,
            model_name=name,
            starts=RuntimeStarts(config.runtime),
        )

    async def close(self) -> None:
        """Close the warm runtimes of its start limits (rollouts close their own)."""
        await self.starts.close()

    @property
    def trajectories_path(self) -> Path | None:
        """`RUN/trajectories.jsonl`, where finished rollouts are appended."""
        return self.run_dir / "trajectories.jsonl" if self.run_dir is not None else None

    def family(self, name: str) -> TaskFamily:
        """The family of a task, built once on first use."""
        if name not in self.families:
            self.families[name] = get_family(name)
        return self.families[name]

    # -- rollouts ------------------------------------------------------------------------------

    async def create(
        self,
        rollout_id: str | None = None,
        *,
        task: Task | None = None,
        task_id: str | None = None,
        sample_index: int = 0,
        runtime: Runtime | None = None,
        score_on_finish: bool = True,
        split_samples: str | None = None,
    ) -> RolloutRecord:
        """A new rollout; with a task it gets a `ToolContext` and a runtime (the one given, else
        a fresh one from the family, which the gateway closes when the rollout finishes);
        `split_samples` "train"/"drop" overrides `agent.split_samples` for this rollout."""
        rollout_id = rollout_id if rollout_id is not None else uuid.uuid4().hex
        check_rollout_id(rollout_id)
        if rollout_id in self.rollouts:
            raise conflict(f"rollout {rollout_id!r} already exists", code="rollout_exists")
        if task is None and task_id is not None:
            task = self.tasks.get(task_id)
            if task is None:
                raise not_found(f"unknown task {task_id!r}", code="unknown_task")
        if split_samples not in (None, "train", "drop"):
            raise bad_request(
                f"split_samples must be 'train' or 'drop', got {split_samples!r}",
                param="split_samples",
            )
        record = RolloutRecord(
            rollout_id,
            task=task,
            sample_index=sample_index,
            score_on_finish=score_on_finish,
            split_samples=split_samples or self.agent.split_samples,
        )
        self.rollouts[rollout_id] = record
        if task is not None:
            owns = runtime is None
            if runtime is None:
                try:
                    with self.starts.active():
                        runtime = await self.family(task.family).make_runtime(task)
                except RuntimeFailure as exc:
                    del self.rollouts[rollout_id]
                    raise GatewayError(
                        503,
                        f"the runtime failed to start: {exc}",
                        type="server_error",
                        code="runtime_error",
                        retry=True,  # nothing was recorded: a new try starts afresh
                    ) from exc
            record.runtime, record.owns_runtime = runtime, owns
            record.ctx = ToolContext(task=task, runtime=runtime)
        return record

    def get(self, rollout_id: str) -> RolloutRecord:
        """The rollout, or a 404."""
        record = self.rollouts.get(rollout_id)
        if record is None:
            raise not_found(f"unknown rollout {rollout_id!r}", code="unknown_rollout")
        return record

    def trajectory(self, rollout_id: str) -> Trajectory:
        """The rollout's trajectory: final once finished, else what is recorded so far."""
        return self.get(rollout_id).build(self.agent.max_turns)

    def split_headers(self, rollout_id: str) -> dict[str, str]:
        """What a chat answer tells the client of splits: `x-conveyor-splits` (so far in the
        rollout), `x-conveyor-sample-index` (the training sample this reply is in) and, on
        the reply whose request split, `x-conveyor-split` (why)."""
        record = self.get(rollout_id)
        ledger = record.ledger
        headers = {
            "x-conveyor-splits": str(ledger.splits if ledger else 0),
            "x-conveyor-sample-index": str(ledger.sample_index if ledger else 0),
        }
        if record.split_now:
            headers["x-conveyor-split"] = _header_text(record.split_now)
        return headers

    def task_info(self, rollout_id: str) -> dict[str, Any]:
        """What the native agent would send: the task's messages, tool schemas and budgets."""
        record = self.get(rollout_id)
        if record.task is None:
            raise bad_request(f"rollout {rollout_id!r} has no task", code="no_task")
        return {
            "task_id": record.task.id,
            "sample_index": record.sample_index,
            "messages": record.task.prompt,
            "tools": self.family(record.task.family).tools().schemas(),
            "max_turns": self.agent.max_turns,
            "max_tokens": self.agent.max_completion_tokens,
        }

    # -- chat ----------------------------------------------------------------------------------

    async def chat(self, rollout_id: str, body: Any) -> dict[str, Any]:
        """One chat completion in a rollout (created on its first request); `body` is the
        decoded request body, or a `ChatRequest` already checked."""
        request = body if isinstance(body, ChatRequest) else parse_chat_request(body)
        record = self.rollouts.get(rollout_id) or await self.create(rollout_id)
        async with record.lock:
            _require_open(record)
            if len(record.turns) >= self.agent.max_turns:
                error = bad_request(
                    f"the rollout used all {self.agent.max_turns} turns (agent.max_turns); "
                    "it ended truncated",
                    code="max_turns",
                )
                await self._close(record, Status.TRUNCATED, EndReason.MAX_TURNS, error)
                raise error
            renderer = self._renderer(request.tools)
            internal, normal = internal_messages(record, request.messages, renderer)
            prompt = advance(record, request, renderer, internal, normal)
            await self._check_budget(record, prompt)
            answer = await self._sample(record, request, renderer, prompt, normal)
            if request.stream:
                record.bump("streamed_requests")
            return answer

    async def respond(self, rollout_id: str, body: Any) -> dict[str, Any]:
        """One Responses API request (`responses`): sampled and recorded as the chat turn it
        stands for; the response's conversation is kept for a later `previous_response_id`."""
        previous = body.get("previous_response_id") if isinstance(body, dict) else None
        earlier = None
        if previous is not None:
            record = self.rollouts.get(rollout_id)
            earlier = record.responses.get(previous) if record is not None else None
            if earlier is None:
                raise bad_request(
                    f"Previous response with id {previous!r} not found in rollout {rollout_id!r}",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
        chat = chat_body(body, earlier)
        answer = await self.chat(rollout_id, parse_chat_request(chat))
        record = self.get(rollout_id)
        record.bump("responses_requests")
        if body.get("stream"):
            record.bump("streamed_requests")
        response = response_object(answer, body)
        kept = chat["messages"][1:] if body.get("instructions") is not None else chat["messages"]
        record.responses[response["id"]] = [
            *kept,
            answer["choices"][0]["message"],
        ]
        return response

    def _renderer(self, tools: list[dict[str, Any]]) -> ChatRenderer:
        key = json.dumps(tools)
        if key not in self._renderers:
            self._renderers[key] = self.make_renderer(tools)
        return self._renderers[key]

    async def _check_budget(self, record: RolloutRecord, prompt: list[int]) -> None:
        agent = self.agent
        if len(prompt) > agent.max_prompt_tokens:
            reason, limit, setting = (
                EndReason.MAX_PROMPT_TOKENS,
                agent.max_prompt_tokens,
                "agent.max_prompt_tokens",
            )
        elif len(prompt) >= agent.max_context_tokens:
            reason, limit, setting = (
                EndReason.MAX_CONTEXT_TOKENS,
                agent.max_context_tokens,
                "agent.max_context_tokens",
            )
        else:
            return
        error = context_length_exceeded(len(prompt), limit, setting)
        await self._close(record, Status.TRUNCATED, reason, error)
        raise error

    async def _sample(
        self,
        record: RolloutRecord,
        request: ChatRequest,
        renderer: ChatRenderer,
        prompt: list[int],
        normal: list[tuple[Any, ...]],
    ) -> dict[str, Any]:
        """Sample the request's `n` choices (one engine request each, seeds `seed`, `seed+1`,
        ...) and record every one as a turn. Choice 0 continues the rollout's current sample;
        each other choice starts a sample of its own (its prompt and reply), kept as a fork: a
        next request that continues choice k extends choice k's sample, with no split."""
        agent, ledger = self.agent, record.ledger
        assert ledger is not None
        turn_index = len(record.turns)
        room = agent.max_context_tokens - len(prompt)
        cap = min(agent.max_completion_tokens, request.max_tokens or agent.max_completion_tokens)
        temperature = request.temperature
        top_p = request.top_p
        seed = (
            request.seed
            if request.seed is not None
            else request_seed(self.sampling.sampling_seed, record.session, turn_index)
        )
        if request.top_logprobs and request.top_logprobs > _max_top_logprobs(self.client):
            raise bad_request(
                f"top_logprobs={request.top_logprobs} is not served by this engine "
                f"({type(self.client).__name__} reports at most "
                f"{_max_top_logprobs(self.client)}: the sampled token's logprob only)",
                param="top_logprobs",
                code="unsupported_value",
            )
        form = request.response_format
        if form is not None and form.type not in _output_formats(self.client):
            raise bad_request(
                f"response_format {form.type!r} is not supported by this engine "
                f"({type(self.client).__name__} has no constrained decoding, so the format "
                "could not be guaranteed); leave response_format out (or 'text') and ask for "
                "JSON in the prompt",
                param="response_format",
                code="unsupported_value",
            )
        if form is not None:
            _check_grammar(form)
        forced = renderer.encode(forced_prefix(request, renderer.tool_format))
        if forced:  # a reply opened as a tool call has no content for the format to govern
            form = None
        elif form is not None and request.tools and request.tool_choice == "auto":
            form = form.model_copy(update={"tool_call_open": tool_call_open()})
        samples = [
            SampleRequest(
                prompt_ids=prompt + forced,
                max_tokens=max(1, min(cap, room) - len(forced)),
                temperature=self.sampling.temperature if temperature is None else temperature,
                top_p=self.sampling.top_p if top_p is None else top_p,
                seed=seed if seed is None or k == 0 else (seed + k) & 0x7FFFFFFF,
                session_id=record.session,
                top_logprobs=request.top_logprobs,
                output_format=form,
            )
            for k in range(request.n)
        ]
        asked = time.monotonic()
        try:
            results = await asyncio.gather(*(self.client.sample(s) for s in samples))
        except Exception as exc:  # every engine failure is infra: the policy did not cause it
            down = isinstance(exc, EngineDown)
            record.error = f"engine failed: {type(exc).__name__}: {exc}"
            record.infra_failure = exc
            reason = EndReason.ENGINE_DOWN if down else EndReason.UNSET
            await self._close(record, Status.INFRA_ERROR, reason)
            await self._finalize(record)
            raise GatewayError(
                503 if down else 502,
                f"the engine failed ({type(exc).__name__}: {exc}); the rollout is an infra_error",
                type="server_error",
                code="engine_down" if down else "engine_error",
            ) from (exc if isinstance(exc, EngineError) else None)
        finally:
            record.engine_s += time.monotonic() - asked
        before = replace(
            ledger, messages=list(ledger.messages), split_reasons=list(ledger.split_reasons)
        )
        choices, forks = [], []
        for k, result in enumerate(results):
            if k == 0:
                fork = ledger
            else:
                fork = replace(
                    before,
                    messages=list(before.messages),
                    split_reasons=list(before.split_reasons),
                    sample_index=record.new_sample_index(),
                )
                record.bump("extra_choices")
            choice, last, history = self._record_choice(
                record,
                request,
                renderer,
                prompt,
                normal,
                fork,
                result,
                forced,
                k,
                room,
                masked=form is not None,
            )
            choices.append(choice)
            forks.append(Fork(history=history, ledger=fork, last=last))
        record.ledger, record.history, record.last = ledger, forks[0].history, forks[0].last
        record.forks = forks[1:]
        completion_tokens = sum(len(t.completion_ids) for t in record.turns[turn_index:])
        return {
            "id": f"chatcmpl-{record.rollout_id}-{turn_index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt) + completion_tokens,
            },
        }

    def _record_choice(
        self,
        record: RolloutRecord,
        request: ChatRequest,
        renderer: ChatRenderer,
        prompt: list[int],
        normal: list[tuple[Any, ...]],
        ledger: TokenLedger,
        result: SampleResult,
        forced: list[int],
        index: int,
        room: int,
        *,
        masked: bool = False,
    ) -> tuple[dict[str, Any], LastTurn, list[tuple[Any, ...]]]:
        """Record one sampled choice on `ledger`: its turn, its raw text in the reply index;
        returns the OpenAI choice, what the outcome depends on and the conversation it ends.

        `masked`: the choice was sampled under a `response_format` grammar, so its logprobs are
        those of the masked distribution, which the trainer (scoring without the mask) cannot
        reproduce: its tokens are recorded with loss mask 0, like forced tokens."""
        turn_index = len(record.turns)
        sampled, logprobs, finish = (
            list(result.token_ids),
            list(result.logprobs),
            result.finish_reason,
        )
        top = list(result.top_logprobs) if result.top_logprobs is not None else None
        kept = kept_before_stop(
            sampled, stop_strings(request, renderer.tool_format), renderer.decode
        )
        if kept is not None:  # a stop string: the reply ends before it, as if it stopped there
            sampled, logprobs, finish = sampled[:kept], logprobs[:kept], StopReason.STOP
            top = top[:kept] if top is not None else None
        stopped = finish == StopReason.STOP
        # forced tokens (tool_choice) are part of the reply, never trained on
        record.turns.append(
            Turn(
                prompt_ids=list(prompt),
                completion_ids=forced + sampled,
                completion_logprobs=[0.0] * len(forced) + logprobs,
                loss_mask=[0] * len(forced) + [0 if masked else 1] * len(sampled),
                policy_version=result.policy_version,
                stop_reason=finish,
                sample_index=ledger.sample_index,
            )
        )
        if forced:
            record.bump("forced_tokens", len(forced))
        if masked:
            record.bump("constrained_tokens", len(sampled))
        assistant = ledger.add_completion(forced + sampled, stopped_on_eos=stopped)
        schemas = {
            s["function"]["name"]: s["function"].get("parameters", {}) for s in request.tools
        }
        parsed = parse_tool_calls(assistant["content"], renderer.tool_format, schemas)
        assistant["_tool_calls"] = [c.model_dump() for c in parsed.calls]
        if parsed.calls:  # the client runs them (`tool_calls` counts the ones run here)
            record.bump("sampled_tool_calls", len(parsed.calls))
        if parsed.errors:
            record.bump("parse_errors", len(parsed.errors))
        agent = self.agent
        last = LastTurn(
            stopped=stopped,
            calls=len(parsed.calls),
            parse_errors=len(parsed.errors),
            length_reason=EndReason.MAX_CONTEXT_TOKENS
            if room < agent.max_completion_tokens
            else EndReason.MAX_COMPLETION_TOKENS,
        )
        # the first choice's call ids are `call_<turn>_<i>`, another choice's name it too
        prefix = f"call_{turn_index}" if index == 0 else f"call_{turn_index - index}c{index}"
        tool_calls: list[dict[str, Any]] = [
            {
                "id": f"{prefix}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for i, c in enumerate(parsed.calls)
        ]
        # A call the parser could not read (malformed, or cut off by the length limit) is not
        # dropped from sight: as an OpenAI-compatible server does, the reply's content is then
        # the model's whole text, so the client sees what the policy wrote.
        content = assistant["content"].strip() if parsed.errors else parsed.content
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content if content or not tool_calls else None,
        }
        if tool_calls:
            message["tool_calls"] = tool_calls
        history = [*normal, normal_message(message)]
        record.replies.add(history, assistant["content"], turn_index)
        record.call_names.update({c["id"]: c["function"]["name"] for c in tool_calls})
        finish_reason = "length" if not stopped else ("tool_calls" if tool_calls else "stop")
        choice = {
            "index": index,
            "message": message,
            "finish_reason": finish_reason,
            "logprobs": _logprobs(renderer, sampled, logprobs, stopped, top)
            if request.logprobs
            else None,
        }
        return choice, last, history

    # -- tools ---------------------------------------------------------------------------------

    async def call_tool(self, rollout_id: str, name: str, arguments: Any) -> dict[str, Any]:
        """Run one of the task family's tools in the rollout's runtime (as the native loop does)."""
        record = self.get(rollout_id)
        if record.task is None or record.ctx is None:
            raise bad_request(f"rollout {rollout_id!r} has no task, so no tools", code="no_task")
        if not isinstance(arguments, dict):
            raise bad_request("the body must be a JSON object of the tool's arguments")
        async with record.lock:
            _require_open(record)
            tools = self.family(record.task.family).tools()
            record.bump("tool_calls")
            try:
                outcome = await tools.execute(
                    ToolCall(name=name, arguments=arguments),
                    record.ctx,
                    timeout_s=self.agent.tool_timeout_s,
                    max_output_chars=self.agent.tool_output_max_chars,
                )
            except (RuntimeFailure, EngineError) as exc:
                record.error = f"runtime failed: {type(exc).__name__}: {exc}"
                record.infra_failure = exc
                await self._close(record, Status.INFRA_ERROR, EndReason.UNSET)
                await self._finalize(record)
                raise GatewayError(
                    502,
                    f"the runtime failed ({exc}); the rollout is an infra_error",
                    type="server_error",
                    code="runtime_error",
                ) from exc
            if outcome.is_error:
                record.bump("tool_errors")
                record.bump(f"tool_{outcome.kind}")
            return {
                "output": outcome.output,
                "is_error": outcome.is_error,
                "finished": bool(record.ctx.state.get("finished")),
            }

    # -- finish --------------------------------------------------------------------------------

    async def finish(self, rollout_id: str, body: Any) -> Trajectory:
        """End a rollout with `{"reward": float}`, `{"answer": str}` or `{}` (the answer the
        `finish` tool submitted); an answer is scored by the task's family."""
        record = self.get(rollout_id)
        if body is None:
            body = {}
        if not isinstance(body, dict) or set(body) - {"reward", "answer"}:
            raise bad_request('the body must be {"reward": float} or {"answer": ...} or {}')
        if "reward" in body and "answer" in body:
            raise bad_request('give "reward" or "answer", not both')
        async with record.lock:
            if record.state is RolloutState.FINISHED:
                raise conflict(f"rollout {rollout_id!r} is already finished")
            if "reward" in body:
                reward = body["reward"]
                if (
                    not isinstance(reward, int | float)
                    or isinstance(reward, bool)
                    or not math.isfinite(reward)
                ):
                    raise bad_request(
                        f"reward must be a finite number, got {reward!r}", param="reward"
                    )
                record.reward = float(reward)
            else:
                if record.task is None:
                    raise bad_request(
                        f"rollout {rollout_id!r} has no task to score an answer: "
                        'finish it with {"reward": float}',
                        param="reward",
                        code="reward_needed",
                    )
                if "answer" in body:
                    record.answer = str(body["answer"])
                if record.score_on_finish:
                    family = self.family(record.task.family)
                    try:
                        with self.starts.active():  # a grader's sandboxes: same limits
                            record.reward = await family.score(
                                record.task,
                                record.submitted_answer(),
                                record.runtime,  # type: ignore[arg-type]
                            )
                    except RuntimeFailure as exc:
                        record.error = f"scoring failed: {exc}"
                        record.infra_failure = exc
                        record.closed_as = (Status.INFRA_ERROR, EndReason.UNSET)
            return await self._finalize(record)

    async def _close(
        self,
        record: RolloutRecord,
        status: Status,
        reason: EndReason,
        error: GatewayError | None = None,
    ) -> None:
        record.state = RolloutState.CLOSED
        record.closed_as = (status, reason)
        record.closed_by = error

    async def _finalize(self, record: RolloutRecord) -> Trajectory:
        trajectory = record.build(self.agent.max_turns)
        record.trajectory, record.state = trajectory, RolloutState.FINISHED
        if record.owns_runtime and record.runtime is not None:
            await record.runtime.close()
        path = self.trajectories_path
        if path is not None:
            line = trajectory.to_json() + "\n"
            await asyncio.to_thread(_append, path, line)
        return trajectory

    async def shutdown(self) -> None:
        """Record every unfinished rollout as an infra_error (the gateway stopped under it)."""
        for record in list(self.rollouts.values()):
            if record.state is not RolloutState.FINISHED:
                record.error = record.error or "the gateway stopped before the rollout finished"
                if record.closed_as is None or record.closed_as[0] is not Status.INFRA_ERROR:
                    record.closed_as = (Status.INFRA_ERROR, EndReason.UNSET)
                await self._finalize(record)


def check_rollout_id(rollout_id: str) -> None:
    """A rollout id is a URL path segment: letters, digits and `._:-`, at most 128."""
    if not _ROLLOUT_ID.match(rollout_id):
        raise not_found(
            f"rollout id {rollout_id!r} is not valid: use 1-128 of A-Z a-z 0-9 . _ : -",
            code="invalid_rollout_id",
        )


def _require_open(record: RolloutRecord) -> None:
    """A 400 for a rollout that takes no more turns: the client must stop, not retry (a 409 is
    retried by the openai SDK). One a budget closed answers that budget's refusal again."""
    if record.state is RolloutState.OPEN:
        return
    if record.state is RolloutState.CLOSED and isinstance(record.closed_by, GatewayError):
        raise record.closed_by
    if record.trajectory is not None:
        status, reason = record.trajectory.status, record.trajectory.stop_reason
        raise bad_request(
            f"rollout {record.rollout_id!r} is finished ({status.value}: {reason.value}); "
            "it takes no more requests",
            code="rollout_finished",
        )
    assert record.closed_as is not None
    status, reason = record.closed_as
    raise bad_request(
        f"rollout {record.rollout_id!r} ended ({status.value}: {reason.value}); "
        "only finish is accepted",
        code="rollout_closed",
    )


def _logprobs(
    renderer: ChatRenderer,
    ids: list[int],
    logprobs: list[float],
    stopped: bool,
    top: list[list[tuple[int, float]]] | None = None,
) -> dict[str, Any]:
    """OpenAI's `choice.logprobs` of the sampled tokens (tool-call markup included; the end of
    turn token and tokens forced by `tool_choice` left out): each token's text, its UTF-8
    bytes, the engine's logprob and, when asked (`top_logprobs`), the engine's most likely
    tokens at that position with theirs."""
    if stopped and ids and renderer.eos_text and renderer.decode(ids[-1:]) == renderer.eos_text:
        ids, logprobs = ids[:-1], logprobs[:-1]

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        token = renderer.decode([token_id])
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    content = []
    for at, (token_id, logprob) in enumerate(zip(ids, logprobs, strict=True)):
        alternatives = top[at] if top is not None and at < len(top) else []
        content.append(
            {**entry(token_id, logprob), "top_logprobs": [entry(t, lp) for t, lp in alternatives]}
        )
    return {"content": content, "refusal": None}


def _header_text(text: str) -> str:
    """`text` as one latin-1 header line (at most 300 characters)."""
    flat = " ".join(text.split())[:300]
    return flat.encode("latin-1", "replace").decode("latin-1")


def _max_top_logprobs(client: Any) -> int:
    """The most `top_logprobs` the engine reports (0: the sampled token's logprob only)."""
    return client.max_top_logprobs if isinstance(client, TopLogprobs) else 0


def _check_grammar(form: OutputFormat) -> None:
    """A 400 for a schema the grammar library cannot compile: the client's fault, found before
    the engine (where it would be an engine failure) sees it."""
    try:
        form.grammar()
    except (RuntimeError, ValueError) as exc:
        message = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise bad_request(
            f"response_format json_schema cannot be enforced: {message}",
            param="response_format",
            code="invalid_value",
        ) from exc


def _output_formats(client: Any) -> frozenset[str]:
    """The `response_format` types the engine enforces (none: it has no constrained decoding)."""
    return client.output_formats if isinstance(client, StructuredOutput) else frozenset()


def _append(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
