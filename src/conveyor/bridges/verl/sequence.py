"""One rollout as VeRL's agent loop returns it: a prompt and one response with mask and logprobs.

VeRL trains one token sequence per rollout (`AgentLoopOutput`): `prompt_ids`, then
`response_ids` with `response_mask` 1 on sampled tokens and 0 on tool output and template glue,
and `response_logprobs` aligned with the response. Our trajectory can hold several samples where
the chat template broke the prefix property; VeRL has no place for more than one, so the first
is kept and the others are dropped and counted (`dropped_samples`), never silently.

Pure Python: both the main venv (the bridge check's reading side) and `.venv-verl` (the agent
loop, the check's VeRL side) use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.types import TrainingSample, Trajectory


@dataclass(frozen=True)
class VerlSequence:
    """The fields of one `AgentLoopOutput`, plus what converting the trajectory dropped."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward_score: float | None
    num_turns: int
    dropped_samples: int

    @classmethod
    def from_sample(
        cls,
        sample: TrainingSample,
        *,
        reward: float | None,
        num_turns: int,
        dropped_samples: int = 0,
    ) -> VerlSequence:
        """Split a training sample at its prompt: what follows the first prompt is the response.

        Our samples hold logprob 0.0 where the mask is 0 (`Trajectory.samples`), which is what
        VeRL expects of tool-output positions; a nonzero one there is an error upstream."""
        cut = sample.prompt_length
        mask = list(sample.loss_mask[cut:])
        logprobs = list(sample.logprobs[cut:])
        if any(m == 0 and lp != 0.0 for m, lp in zip(mask, logprobs, strict=True)):
            raise ValueError("a sample holds a nonzero logprob on a token with loss mask 0")
        if any(sample.loss_mask[:cut]):
            raise ValueError("a sample has loss-masked tokens inside its first prompt")
        return cls(
            prompt_ids=list(sample.input_ids[:cut]),
            response_ids=list(sample.input_ids[cut:]),
            response_mask=mask,
            response_logprobs=logprobs,
            reward_score=reward,
            num_turns=num_turns,
            dropped_samples=dropped_samples,
        )

    @classmethod
    def from_trajectory(cls, trajectory: Trajectory) -> VerlSequence | None:
        """The trajectory's first sample as VeRL's one sequence; None when it has no turn.

        `num_turns` counts chat messages the way VeRL's loops do (user, assistant and tool
        messages alike) from the trajectory's message log, bookkeeping records excluded."""
        samples = trajectory.samples()
        if not samples:
            return None
        messages = [m for m in trajectory.messages if not m.get("_meta")]
        return cls.from_sample(
            samples[0],
            reward=trajectory.reward,
            num_turns=len(messages),
            dropped_samples=len(samples) - 1,
        )
