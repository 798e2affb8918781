"""Chat rendering with exact token accounting.

The model's own chat template renders the conversation. Templates that know about tools get the
OpenAI schemas through `tools=`; templates that do not (SmolLM2's, for one) get the Hermes/Qwen
convention written into the system message, with tool results as `<tool_response>` user turns.

`TokenLedger` keeps the one invariant the trainer needs: sampled tokens are never re-tokenized.
After each turn it renders the conversation text in full and checks that it starts with the
previous prompt text plus the completion text exactly; then only the new suffix (template glue
such as the newline after `<|im_end|>`, tool output, hints, the next generation prompt) is
tokenized and appended, all with loss mask 0. Where a template rewrites earlier turns (Qwen3
strips earlier reasoning), the check fails and a new training sample starts from the full
rendering: a split, counted.

`model.reasoning_history: keep` removes that cause: every assistant turn renders exactly as it
was sampled, `<think>` reasoning and whitespace included, whatever the template would make of it.
The template still writes everything around the assistant's text (roles, tool responses, the
generation prompt); only the assistant content is put back verbatim (`ChatRenderer._verbatim`).
A multi-turn rollout then stays one growing sequence: one training sample with a loss mask over
the model's own tokens, instead of one sample per turn that carries the whole prefix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from conveyor.types import Message, TokenIds

if TYPE_CHECKING:
    from conveyor.config import ModelConfig

ToolFormat = Literal["hermes", "xml"]
# `model.reasoning_history`: the template decides how earlier assistant turns render ("template"),
# or every assistant turn renders exactly as sampled ("keep").
ReasoningHistory = Literal["template", "keep"]


class Tokenizer(Protocol):
    """The slice of a Hugging Face tokenizer that rendering needs."""

    chat_template: Any
    eos_token: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        """Render messages to text (with `tokenize=False`)."""
        ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """Text to ids."""
        ...

    def decode(self, ids: Any, skip_special_tokens: bool = ...) -> str:
        """Ids to text."""
        ...


def template_supports_tools(template: str | None) -> bool:
    """Whether a Jinja chat template renders a `tools` argument (by inspection of its source)."""
    return bool(template) and "tools" in str(template)


def compact_system_block(schemas: list[dict[str, Any]]) -> str:
    """One line per tool (`name(arg: type, ...): description`), for small models and budgets.

    About a quarter of the tokens of the JSON-schema block; the call convention stays Hermes.
    """
    lines = ["Tools:"]
    for schema in schemas:
        function = schema["function"]
        properties = function.get("parameters", {}).get("properties", {})
        args = ", ".join(f"{name}: {spec.get('type', 'any')}" for name, spec in properties.items())
        lines.append(f"- {function['name']}({args}): {function.get('description', '')}")
    lines.append('Call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.')
    return "\n".join(lines)


def hermes_system_block(schemas: list[dict[str, Any]]) -> str:
    """The tool description Qwen2.5's template writes, for templates that have none."""
    lines = [
        "# Tools",
        "",
        "You may call one or more functions to assist with the user query.",
        "",
        "You are provided with function signatures within <tools></tools> XML tags:",
        "<tools>",
        *(json.dumps(s, ensure_ascii=False) for s in schemas),
        "</tools>",
        "",
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:",
        "<tool_call>",
        '{"name": <function-name>, "arguments": <args-json-object>}',
        "</tool_call>",
    ]
    return "\n".join(lines)


class ChatRenderer:
    """Renders conversations to text and ids with the model's template (or the Hermes fallback)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        tool_schemas: list[dict[str, Any]],
        *,
        chat_template: str | None = None,
        tool_format: Literal["auto", "hermes", "xml"] = "auto",
        tool_prompt: Literal["schema", "compact"] = "schema",
        reasoning_history: ReasoningHistory = "template",
    ) -> None:
        self.tokenizer = tokenizer
        self.reasoning_history: ReasoningHistory = reasoning_history
        self.tool_schemas = tool_schemas
        self.chat_template = chat_template or tokenizer.chat_template
        if not self.chat_template:
            raise ValueError("the tokenizer has no chat template; set model.chat_template")
        self.native_tools = template_supports_tools(self.chat_template)
        self.tool_prompt = tool_prompt
        if tool_format == "auto":
            tool_format = "xml" if "<function=" in str(self.chat_template) else "hermes"
        self.tool_format: ToolFormat = tool_format
        eos = tokenizer.eos_token
        self.eos_text: str = eos if isinstance(eos, str) else ""

    def _prepare(self, messages: list[Message]) -> list[Message]:
        if self.native_tools:
            return [_strip_private(m) for m in messages]
        out: list[Message] = []
        for message in messages:
            message = _strip_private(message)
            if message["role"] == "tool":
                message = {
                    "role": "user",
                    "content": f"<tool_response>\n{message['content']}\n</tool_response>",
                }
            out.append(message)
        if self.tool_schemas:
            if self.tool_prompt == "compact":
                block = compact_system_block(self.tool_schemas)
            else:
                block = hermes_system_block(self.tool_schemas)
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
            else:
                out.insert(0, {"role": "system", "content": block})
        return out

    def render(self, messages: list[Message], *, add_generation_prompt: bool) -> str:
        """The full conversation text as the template writes it (with `reasoning_history:
        keep`, each assistant turn as it was sampled)."""
        prepared = self._prepare(messages)
        if self.reasoning_history == "keep" and any(m["role"] == "assistant" for m in prepared):
            return self._verbatim(prepared, add_generation_prompt)
        return self._apply(prepared, add_generation_prompt)

    def _apply(self, prepared: list[Message], add_generation_prompt: bool) -> str:
        kwargs: dict[str, Any] = {}
        if self.native_tools and self.tool_schemas:
            kwargs["tools"] = self.tool_schemas
        text = self.tokenizer.apply_chat_template(
            prepared,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=self.chat_template,
            **kwargs,
        )
        return str(text)

    def _verbatim(self, prepared: list[Message], add_generation_prompt: bool) -> str:
        """Render with each assistant content replaced by a placeholder, then put the sampled
        text back in place of the placeholder.

        A placeholder holds no `<think>`, so a template that parses reasoning out of the content
        (Qwen3, DeepSeek-R1) has none to drop or to re-space and writes it as it is. A template
        that adds an empty think block in front of a *trailing* assistant turn (Qwen3, in a
        rendering without the generation prompt) would put it before sampled reasoning: there
        the turn renders as its own prompt (the earlier messages with the generation prompt)
        plus the sampled text plus the template's end of turn, which is what the model saw.
        """
        contents: dict[str, str] = {}
        masked: list[Message] = []
        for index, message in enumerate(prepared):
            if message["role"] == "assistant":
                mark = f"CONVEYOR{self._nonce}ASSISTANT{index}END"
                contents[mark] = str(message.get("content") or "")
                message = {
                    k: v for k, v in message.items() if k not in ("reasoning_content", "content")
                }
                message["content"] = mark
            masked.append(message)
        text = self._apply(masked, add_generation_prompt)
        last = masked[-1]
        if not add_generation_prompt and last["role"] == "assistant":
            mark = str(last["content"])
            if text.count(mark) != 1:
                raise ValueError(self._not_verbatim(mark))
            head = self._verbatim(prepared[:-1], True) if len(prepared) > 1 else ""
            return head + contents[mark] + text[text.index(mark) + len(mark) :]
        for mark, content in contents.items():
            if text.count(mark) != 1:
                raise ValueError(self._not_verbatim(mark))
            text = text.replace(mark, content)
        return text

    @property
    def _nonce(self) -> str:
        return f"{id(self):x}"

    def _not_verbatim(self, mark: str) -> str:
        return (
            "model.reasoning_history 'keep' needs a chat template that writes an assistant "
            f"message's content as given; this one did not write it exactly once ({mark}); "
            "fix: set model.reasoning_history: template, or give model.chat_template"
        )

    def encode(self, text: str) -> TokenIds:
        """Tokenize template text (special tokens in it are parsed; no BOS/EOS added)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: TokenIds) -> str:
        """Ids back to text, special tokens kept."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def assistant_content(self, completion_text: str, stopped_on_eos: bool) -> str:
        """The assistant message content that renders back to the sampled text."""
        if stopped_on_eos and self.eos_text and completion_text.endswith(self.eos_text):
            return completion_text[: -len(self.eos_text)]
        return completion_text


# Tool schemas -> the renderer for a conversation with those tools.
RendererFactory = Callable[[list[dict[str, Any]]], "ChatRenderer"]


def renderer_factory(model: ModelConfig, tokenizer: Tokenizer) -> RendererFactory:
    """Renderers for tool sets with the `model` section's template, tool format and tool
    prompt: what the native loop and the recording gateway both render with, so the two give
    the same ids."""
    template = Path(model.chat_template).read_text() if model.chat_template else None

    def make(schemas: list[dict[str, Any]]) -> ChatRenderer:
        return ChatRenderer(
            tokenizer,
            schemas,
            chat_template=template,
            tool_format=model.tool_format,
            tool_prompt=model.tool_prompt,
            reasoning_history=model.reasoning_history,
        )

    return make


def _strip_private(message: Message) -> Message:
    """Drop our bookkeeping keys (prefixed with '_') and parsed tool calls before rendering.

    The assistant's raw text already holds its calls exactly as sampled; handing the template a
    `tool_calls` field too would render them a second time in the template's own JSON style.
    """
    return {k: v for k, v in message.items() if not k.startswith("_") and k != "tool_calls"}


@dataclass
class TokenLedger:
    """Exact token ids of a growing conversation: the prefix property, or a counted split.

    Use: `start(messages)` -> prompt ids; after each generation `add_completion(ids, ...)`, then
    `next_prompt(follow_up_messages)` (tool results and hints) -> the next prompt ids.
    """

    renderer: ChatRenderer
    messages: list[Message] = field(default_factory=list)
    prompt_ids: TokenIds = field(default_factory=list)
    prompt_text: str = ""
    sample_index: int = 0
    splits: int = 0
    split_reasons: list[str] = field(default_factory=list)
    _pending: tuple[TokenIds, str] = field(default_factory=lambda: ([], ""), repr=False)

    def start(self, messages: list[Message]) -> TokenIds:
        """Render the opening messages with the generation prompt."""
        self.messages = list(messages)
        self.prompt_text = self.renderer.render(self.messages, add_generation_prompt=True)
        self.prompt_ids = self.renderer.encode(self.prompt_text)
        return self.prompt_ids

    def add_completion(self, completion_ids: TokenIds, *, stopped_on_eos: bool) -> Message:
        """Record the sampled completion as an assistant message (content = the sampled text)."""
        text = self.renderer.decode(completion_ids)
        content = self.renderer.assistant_content(text, stopped_on_eos)
        message: Message = {"role": "assistant", "content": content}
        self.messages.append(message)
        self._pending = (list(completion_ids), text)
        return message

    def next_prompt(self, new_messages: list[Message]) -> TokenIds:
        """Append follow-up messages and return the next prompt ids (extending, or a split)."""
        completion_ids, completion_text = self._pending
        self.messages.extend(new_messages)
        full_text = self.renderer.render(self.messages, add_generation_prompt=True)
        expected = self.prompt_text + completion_text
        if full_text.startswith(expected):
            delta = self.renderer.encode(full_text[len(expected) :])
            self.prompt_ids = self.prompt_ids + completion_ids + delta
        else:
            at = _first_difference(full_text, expected)
            self.split_reasons.append(
                f"turn text changed at char {at}: expected {expected[at : at + 40]!r}, "
                f"template wrote {full_text[at : at + 40]!r}"
            )
            self.prompt_ids = self.renderer.encode(full_text)
            self.sample_index += 1
            self.splits += 1
        self.prompt_text = full_text
        return self.prompt_ids


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
