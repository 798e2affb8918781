"""SkyRL's per-batch `sampling_params` as our `SamplingConfig`, or a refusal naming the key.

SkyRL-train sends vLLM's parameters for every batch (`get_vllm_sampling_params`: `temperature`,
`top_p`, `top_k`, `min_p`, `max_tokens`, `min_tokens`, `stop`, `logprobs`,
`skip_special_tokens`, `include_stop_str_in_output`, plus any extras). A key is taken over
(`temperature`, `top_p`, `seed`), accepted because it cannot change the sampled token ids
(text-only options, `logprobs`: ours always come back), accepted at its neutral value only
(`top_k`, `min_p`, `min_tokens`, `stop`), or checked against the agent's per-turn budget
(`max_tokens`). Anything else is refused: a setting silently not applied would sample from
another distribution than SkyRL believes.
"""

from __future__ import annotations

from typing import Any

from conveyor.config import SamplingConfig

# SkyRL/vLLM name -> `SamplingConfig` field.
TAKEN = {"temperature": "temperature", "top_p": "top_p", "seed": "sampling_seed"}
# Options of text decoding or of what is returned, never of which ids are sampled.
IGNORABLE = frozenset({"logprobs", "skip_special_tokens", "include_stop_str_in_output"})
# Options we do not implement, accepted at the value that disables them.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "top_k": (None, -1, 0),
    "min_p": (None, 0, 0.0),
    "min_tokens": (None, 0, 1),
    "stop": (None, [], ()),
}


def to_sampling(
    params: dict[str, Any] | None,
    base: SamplingConfig | None,
    max_completion_tokens: int | None,
) -> SamplingConfig | None:
    """Our sampling settings for one batch (None when SkyRL sent none). `base` is the run's
    `sampling` section (None: fixed stages, so any taken key is refused); `max_completion_tokens`
    the agent's per-turn budget, which SkyRL's `max_tokens` must not be below."""
    if not params:
        return None
    refused = []
    for key, value in params.items():
        if key in TAKEN or key in IGNORABLE:
            continue
        if key == "max_tokens":
            if value is not None and max_completion_tokens is not None:
                if value < max_completion_tokens:
                    refused.append(
                        f"max_tokens={value} (below agent.max_completion_tokens="
                        f"{max_completion_tokens}; lower that instead)"
                    )
            continue
        if key in NEUTRAL:
            if value not in NEUTRAL[key]:
                refused.append(f"{key}={value!r} (only {NEUTRAL[key]!r} is supported)")
            continue
        refused.append(f"{key}={value!r} (unknown)")
    if refused:
        raise ValueError(f"unsupported SkyRL sampling_params: {'; '.join(refused)}")
    update = {ours: params[key] for key, ours in TAKEN.items() if key in params}
    if base is None:
        if update:
            raise ValueError(
                "this ConveyorGenerator runs fixed stages: build it with from_composition "
                f"to honour SkyRL's sampling_params {sorted(update)}"
            )
        return None
    return base.model_copy(update=update)
