"""`python -m conveyor.bridges.verl.check_main TRAJECTORIES [--model DIR]`, inside `.venv-verl`.

Turns each trajectory into the `AgentLoopOutput` our agent loop returns (`output_of`), runs
VeRL's OWN post-processing on them, the steps its `AgentLoopWorker` takes after an agent loop's
`run`: `_agent_loop_postprocess` (pad each output to the rollout's prompt and response lengths,
masks, position ids) and `_postprocess` (stack into the `DataProto` the trainer consumes). Then
it reads the DataProto back, unpadded by its attention mask, and checks it against our samples.
Prints the `CheckReport` JSON as its last line (`conveyor.bridges.verl.check` reads it).

The worker is built without its constructor, which needs Ray actors, rollout servers and a full
trainer config; only the attributes the two post-processing methods read are set, the tokenizer
loaded by VeRL's own `hf_tokenizer` as its `HFModelConfig` does.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto
from verl.utils import hf_tokenizer
from verl.workers.config import RolloutConfig

from conveyor.bridges.report import CheckReport
from conveyor.bridges.verl.agent_loop import output_of
from conveyor.models import resolve_model_path
from conveyor.types import Status, TrainingSample, Trajectory

# Padding beyond the longest prompt and response, so the check also sees padded positions.
_SLACK = 8
# rollout_log_probs are float32 in the DataProto; ours are Python floats.
_LOGPROB_TOL = 1e-6


def worker(tokenizer: Any, prompt_length: int, response_length: int) -> AgentLoopWorker:
    """An `AgentLoopWorker` holding only what its post-processing reads."""
    w = AgentLoopWorker.__new__(AgentLoopWorker)
    w.tokenizer = tokenizer
    w.processor = None
    w.rollout_config = RolloutConfig(
        name="vllm", prompt_length=prompt_length, response_length=response_length
    )
    w.reward_loop_worker_handles = None
    w.distillation_enabled = False
    w.mm_processor_kwargs = {}
    return w


async def to_dataproto(trajectories: list[Trajectory], tokenizer: Any) -> DataProto:
    """Our outputs through VeRL's per-rollout and batch post-processing."""
    outputs = [output_of(t) for t in trajectories]
    w = worker(
        tokenizer,
        max(len(o.prompt_ids) for o in outputs) + _SLACK,
        max(len(o.response_ids) for o in outputs) + _SLACK,
    )
    padded = [
        await w._agent_loop_postprocess(o, False, raw_prompt=t.messages[:1])
        for o, t in zip(outputs, trajectories, strict=True)
    ]
    return w._postprocess(padded, input_non_tensor_batch=None, validate=False)


def compare(data: DataProto, trajectories: list[Trajectory], report: CheckReport) -> None:
    """Named checks of the DataProto's unpadded rows against our first samples."""
    batch = data.batch
    width = batch["prompts"].shape[1]
    firsts: list[TrainingSample] = [t.samples()[0] for t in trajectories]
    report.add("batch_size", batch.batch_size[0] == len(firsts), f"{batch.batch_size[0]} rows")
    bad: dict[str, list[str]] = {
        k: [] for k in ("sequence", "mask", "logprobs", "score", "input_ids", "num_turns")
    }
    worst = 0.0
    for i, (t, sample) in enumerate(zip(trajectories, firsts, strict=True)):
        tag = f"{t.task_id}/{t.sample_index}"
        attention = batch["attention_mask"][i].bool()
        prompt = batch["prompts"][i][attention[:width]].tolist()
        keep = attention[width:]
        response = batch["responses"][i][keep].tolist()
        n = len(response)
        if prompt != list(sample.input_ids[: sample.prompt_length]) or prompt + response != list(
            sample.input_ids
        ):
            bad["sequence"].append(tag)
        if batch["input_ids"][i][attention].tolist() != list(sample.input_ids):
            bad["input_ids"].append(tag)
        mask = batch["response_mask"][i].tolist()
        if [0] * len(prompt) + mask[:n] != list(sample.loss_mask) or any(mask[n:]):
            bad["mask"].append(tag)
        logprobs = batch["rollout_log_probs"][i].tolist()
        ours = sample.logprobs[sample.prompt_length :]
        diff = max((abs(a - b) for a, b in zip(logprobs[:n], ours, strict=True)), default=0.0)
        worst = max(worst, diff)
        if len(ours) != n or diff > _LOGPROB_TOL or any(logprobs[n:]):
            bad["logprobs"].append(tag)
        scores = batch["rm_scores"][i].tolist()
        expected = [0.0] * len(scores)
        expected[n - 1] = float(t.reward) if t.reward is not None else math.nan
        if any(abs(a - b) > _LOGPROB_TOL for a, b in zip(scores, expected, strict=True)):
            bad["score"].append(tag)
        messages = [m for m in t.messages if not m.get("_meta")]
        if int(data.non_tensor_batch["__num_turns__"][i]) != len(messages):
            bad["num_turns"].append(tag)
    details = {
        "sequence": "unpadded prompt + response == our sample's input_ids, split at its prompt",
        "input_ids": "input_ids under the attention mask == our sample's input_ids",
        "mask": "response_mask == our loss mask after the prompt, 0 on padding",
        "logprobs": f"rollout_log_probs == our behaviour logprobs (max |diff| {worst:.2e})",
        "score": "rm_scores: the reward on the last response token, 0 elsewhere",
        "num_turns": "__num_turns__ == the trajectory's chat messages",
    }
    for name, tags in bad.items():
        report.add(name, not tags, details[name] + (f"; differs: {tags[:5]}" if tags else ""))


def main(argv: list[str] | None = None) -> int:
    """Print the report; exit 0 whatever it says (the caller reads `ok`)."""
    parser = argparse.ArgumentParser(prog="conveyor.bridges.verl.check_main")
    parser.add_argument("trajectories", type=Path)
    parser.add_argument("--model", default=None, help="tokenizer folder (default: embedded)")
    args = parser.parse_args(argv)
    lines = args.trajectories.read_text().splitlines()
    every = [Trajectory.model_validate_json(line) for line in lines if line.strip()]
    # Infra errors never reach VeRL (our agent loop raises them to its worker).
    usable = [t for t in every if t.status is not Status.INFRA_ERROR and t.turns]
    report = CheckReport(
        backend="verl", version=version("verl"), samples=sum(len(t.samples()) for t in usable)
    )
    report.add(
        "trajectories",
        bool(usable),
        f"{len(usable)} of {len(every)} trajectories have turns and no infra error",
    )
    if usable:
        tokenizer = hf_tokenizer(str(resolve_model_path(args.model)))
        data = asyncio.run(to_dataproto(usable, tokenizer))
        compare(data, usable, report)
        dropped = sum(len(t.samples()) - 1 for t in usable)
        counted = sum(int(x) for x in data.non_tensor_batch["conveyor_dropped_samples"])
        report.add(
            "dropped_samples_counted",
            dropped == counted,
            f"{dropped} split samples dropped (one sequence per rollout), {counted} counted "
            "in extra_fields.conveyor_dropped_samples",
        )
    print(report.dumps())
    return 0


if __name__ == "__main__":
    sys.exit(main())
