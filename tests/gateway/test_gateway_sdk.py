"""The real `openai` client against the real gateway on a port, over the real model (HFEngine,
float32): resent histories reuse the sampled ids, an edited one is exactly one split, and the
recorded trajectory trains one built-in step like a native one."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from conveyor.config import AgentConfig, HintsConfig, TrainerConfig
from conveyor.tasks.family import get_family
from conveyor.types import Trajectory

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_engine(model_dir: Path) -> Any:
    from conveyor.engines.hf_local import HFEngine

    return HFEngine(model_dir)


def _turn(
    client: openai.OpenAI,
    http: httpx.Client,
    rollout: str,
    info: dict[str, Any],
    messages: list[dict[str, Any]],
) -> None:
    """One SDK turn: ask, append the reply as the SDK returns it, answer its tool calls."""
    reply = client.chat.completions.create(
        model="policy",
        messages=messages,
        tools=info["tools"],  # type: ignore[arg-type]
        max_tokens=info["max_tokens"],
        temperature=0,
    )
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        out = http.post(
            f"{rollout}/tools/{call.function.name}", json=json.loads(call.function.arguments)
        ).json()
        messages.append({"role": "tool", "tool_call_id": call.id, "content": out["output"]})
    if not message.tool_calls:
        messages.append({"role": "user", "content": "Use a tool, then call finish."})


def _assert_prefix_property(trajectory: Trajectory) -> None:
    turns = trajectory.turns
    for before, after in itertools.pairwise(turns):
        if after.sample_index != before.sample_index:
            continue
        sent = before.prompt_ids + before.completion_ids
        assert after.prompt_ids[: len(sent)] == sent


def test_sdk_conversation_reuses_ids_and_an_edit_is_one_split_and_it_trains(
    hf_engine: Any, model_dir: Path, tmp_path: Path, make_gw: Any, serve: Any
) -> None:
    task = get_family("filenav").make_tasks(1, 0, "eval")[0]
    agent = AgentConfig(max_turns=8, max_completion_tokens=48, hints=HintsConfig(enabled=False))
    gateway = make_gw(hf_engine, tasks=[task], run_dir=tmp_path, agent=agent)
    with serve(gateway) as url, httpx.Client(timeout=120) as http:
        created = http.post(f"{url}/rollouts", json={"task_id": task.id}).json()
        rollout = f"{url}/rollouts/{created['rollout_id']}"
        info = http.get(f"{rollout}/task").json()
        assert info["messages"] == task.prompt
        client = openai.OpenAI(base_url=created["base_url"], api_key="x", max_retries=0)
        messages = list(info["messages"])
        for _ in range(5):
            _turn(client, http, rollout, info, messages)
        five = Trajectory.model_validate(http.get(rollout).json())
        assert len(five.turns) == 5
        assert five.counters["splits"] == 0
        assert {t.sample_index for t in five.turns} == {0}
        _assert_prefix_property(five)
        # every later prompt carries every earlier completion verbatim: ids reused, not re-tokenized
        last = five.turns[-1].prompt_ids
        at = 0
        for turn in five.turns[:-1]:
            start = len(turn.prompt_ids)
            assert last[start : start + len(turn.completion_ids)] == turn.completion_ids
            at = start
        assert at > 0

        # Edit the user's question, keep the rest: a fresh render, one new sample, one split.
        edited = [dict(m) for m in messages[:-1]]
        edited[1] = {**edited[1], "content": edited[1]["content"] + " Please be quick."}
        if edited[-1]["role"] == "assistant":
            edited.append({"role": "user", "content": "Go on."})
        _turn(client, http, rollout, info, edited)
        _turn(client, http, rollout, info, edited)  # continuing the edited history: no new split
        split = Trajectory.model_validate(http.get(rollout).json())
        assert split.counters["splits"] == 1
        assert [t.sample_index for t in split.turns] == [0] * 5 + [1, 1]
        _assert_prefix_property(split)

        done = http.post(f"{rollout}/finish", json={"reward": 1.0})
        assert done.status_code == 200
    on_disk = [
        Trajectory.from_json(line)
        for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()
    ]
    assert len(on_disk) == 1 and on_disk[0].reward == 1.0 and len(on_disk[0].turns) == 7

    from conveyor.trainer.backend import TrainBatch
    from conveyor.trainer.engine import TorchTrainingEngine

    samples = on_disk[0].samples()
    assert len(samples) == 2
    trainer = TorchTrainingEngine(model_dir, TrainerConfig())
    result = trainer.step(TrainBatch(items=[(s, 1.0) for s in samples]))
    assert math.isfinite(result.loss)
    assert result.trained_tokens == sum(len(t.completion_ids) for t in on_disk[0].turns)
    print(
        f"trained_tokens={result.trained_tokens} logprob_diff_mean={result.logprob_diff_mean:.2e}"
    )
    assert result.logprob_diff_mean < 0.05, result.logprob_diff_mean
