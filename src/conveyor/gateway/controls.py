"""What a chat request asks of one reply beyond the sampler's settings: `tool_choice` and `stop`.

The engine takes prompt ids and stop token ids only, so both are enforced around it, in ways
that keep the recorded turn true to what the policy sampled:

- `tool_choice` "required" or a named function: the reply is made to open a tool call (that
  function's, when named) by appending the opening of the call, in the model's tool-call format,
  to the prompt the engine continues. Those forced tokens are recorded as part of the reply
  with loss mask 0 (and logprob 0.0): the trainer sees them and learns nothing from them.
- `tool_choice` "none": the opening of a tool call is a stop string, so the reply ends before
  any call.
- `stop` strings: the reply is cut before the first sampled token that reaches into one, as
  if it had ended there; the tokens kept are unchanged samples of the policy, and what is
  recorded is exactly what the client gets (no part of a stop string reaches either, and a
  token that holds text before the stop string as well is dropped whole).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from conveyor.agent.chat import ToolFormat
from conveyor.gateway.chat_request import ChatRequest
from conveyor.types import TokenIds

_CALL_OPEN = "<tool_call>"
_XML_FUNCTION = "<function="


def forced_prefix(request: ChatRequest, tool_format: ToolFormat) -> str:
    """The text a reply must start with for the request's `tool_choice` ("" when none)."""
    if request.named_tool:
        if tool_format == "xml":
            return f"{_CALL_OPEN}\n{_XML_FUNCTION}{request.tool_choice}>\n"
        return f'{_CALL_OPEN}\n{{"name": {json.dumps(request.tool_choice)}, "arguments": '
    if request.tool_choice == "required":
        return f"{_CALL_OPEN}\n{_XML_FUNCTION}" if tool_format == "xml" else f"{_CALL_OPEN}\n"
    return ""


def tool_call_open() -> str:
    """The text a tool call opens with, in every tool format: what a `response_format` grammar
    lets a reply start with instead of the JSON content when tools are offered (auto)."""
    return _CALL_OPEN


def stop_strings(request: ChatRequest, tool_format: ToolFormat) -> tuple[str, ...]:
    """The request's stop strings, with the opening of a tool call under `tool_choice` none."""
    if request.tool_choice == "none" and not request.named_tool:
        opening = (_CALL_OPEN, _XML_FUNCTION) if tool_format == "xml" else (_CALL_OPEN,)
        return (*request.stop, *opening)
    return request.stop


def kept_before_stop(
    ids: TokenIds, stops: Sequence[str], decode: Callable[[TokenIds], str]
) -> int | None:
    """How many leading `ids` to keep: the most whose text ends at or before the first stop
    string (a stop string spans tokens, so the cut is where it starts, not where it is
    complete); None when no stop string appears."""
    text = decode(ids)
    found = [at for at in (text.find(stop) for stop in stops) if at >= 0]
    if not found:
        return None
    at = min(found)
    low, high = 0, len(ids)  # the longest prefix whose text is no longer than `at`
    while low < high:
        middle = (low + high + 1) // 2
        if len(decode(ids[:middle])) <= at:
            low = middle
        else:
            high = middle - 1
    return low
