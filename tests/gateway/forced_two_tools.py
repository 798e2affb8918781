"""A plugin engine for `conveyor train` (`plugins: [gateway.forced_two_tools]`, `engine.kind:
forced_two_tools`): the real embedded model (HFEngine: its weights, its weight updates, its
logprobs) whose words are a script's, for the usertasks calculator tasks ("What is A * B + C?").

Each rollout calls `multiply(A, B)`, then `add(A*B, C)`, then answers: sample 0 of a group with
the right number, every other sample one off, so each GRPO group has a reward spread and every
sample trains. The logprob of each scripted token is the real model's (one forward over prompt
and reply, at the request's temperature), so the trainer's logprobs must match it as they match
a sampled reply's. Only the choice of tokens is fake: the 135M model does not call tools.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from conveyor.config import ConveyorConfig
from conveyor.engines.base import SampleRequest, SampleResult, SamplingClient
from conveyor.engines.hf_local import HFEngine
from conveyor.registry import ENGINES
from conveyor.types import StopReason

QUESTION = re.compile(r"What is (\d+) \* (\d+) \+ (\d+)\?")


class ForcedTwoTools(HFEngine):
    """HFEngine whose replies are scripted and scored by the model (see the module)."""

    def __init__(self, model_dir: Path, **options: Any) -> None:
        from transformers import AutoTokenizer

        super().__init__(model_dir, **options)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    def words(self, request: SampleRequest) -> str:
        text = str(self.tokenizer.decode(request.prompt_ids))
        a, b, c = (int(x) for x in QUESTION.findall(text)[-1])
        replied = text.count("<|im_start|>assistant") - 1  # the prompt opens the next reply
        if replied == 0:
            return _call("multiply", a, b)
        if replied == 1:
            return _call("add", a * b, c)
        sample_index = int(request.session_id.rsplit("/", 1)[-1])
        return str(a * b + c + (0 if sample_index == 0 else 1))

    def _generate(self, request: SampleRequest, deadline: float | None) -> SampleResult:
        torch = self._torch
        ids = self.tokenizer.encode(self.words(request), add_special_tokens=False)
        ids.append(int(self.eos_token_id))
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([request.prompt_ids + ids])).logits[0]
        rows = logits[len(request.prompt_ids) - 1 : -1].float()
        if request.temperature > 0:
            rows = rows / request.temperature
        logp = torch.log_softmax(rows, dim=-1)
        return SampleResult(
            token_ids=ids,
            logprobs=[float(logp[i, t]) for i, t in enumerate(ids)],
            finish_reason=StopReason.STOP,
            policy_version=self._version,
        )


def _call(name: str, a: int, b: int) -> str:
    arguments = json.dumps({"name": name, "arguments": {"a": a, "b": b}})
    return f"<tool_call>\n{arguments}\n</tool_call>"


@ENGINES.register("forced_two_tools", weight_updates=True)
def build(config: ConveyorConfig, model_dir: Path) -> SamplingClient:
    """The embedded model with scripted words (this module's docstring)."""
    return ForcedTwoTools(model_dir, request_timeout_s=config.engine.request_timeout_s)
