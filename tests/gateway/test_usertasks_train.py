"""`conveyor train configs/usertasks-agents.yaml` end to end: the unmodified openai-agents
program (`Runner.run_streamed`, two function tools, the Responses API) run once per rollout by
`agent.external_command` against the run's recording gateway, on the example tasks file with
its own reward command, two RL steps. Read back from the run folder: steps done, no infra
retry, no split, and the trainer's logprobs against the ones the gateway recorded.

The real embedded model (SmolLM2-135M) never calls a tool and rarely answers right, so its
groups mostly have one reward and train nothing (`train/probed_tokens` says so; measured once,
docs/gateway.md: a CI test of it compared no token and was dropped for CI time). The
`__fake_policy` run gives the same command the real model's weights with scripted words
(`gateway/forced_two_tools.py`, a plugin engine): every rollout calls both tools, then answers,
right in one sample of each group and wrong in the other, so every tool-call turn trains and its
logprobs are compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "tasks.num_tasks=2",
    "rl.tasks_per_step=1",
    "tasks.group_size=2",
    "rl.checkpoints.every=0",  # 1.5 GB a step of the 135M model with its optimizer
    "rl.export_final=false",
    "trainer.train_last_layers=1",  # a cheaper backward; the logprobs compared are the same
]


def _train(run_dir: Path, *extra: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run the command; its metrics and rollout records."""
    args = [sys.executable, "-m", "conveyor.cli", "train", "configs/usertasks-agents.yaml"]
    for item in [f"run.dir={run_dir}", *SMALL, *extra]:
        args += ["--set", item]
    env = dict(os.environ)
    # the config's agent is `python ...`: this interpreter; the plugin engine lives in tests/
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "src"), str(REPO / "tests"), env.get("PYTHONPATH", "")]
    )
    result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    return metrics, rollouts


def _check_run(
    metrics: list[dict[str, Any]], rollouts: list[dict[str, Any]], tokenizer: Any
) -> None:
    """Two steps of 2 rollouts, each the openai-agents program's, none retried or split, the
    trainer's logprobs within 1e-3 of the recorded ones."""
    assert [m["step"] for m in metrics] == [1, 2]
    assert sorted(r["step"] for r in rollouts) == [1, 1, 2, 2]
    for m in metrics:
        assert m["status/infra_error"] == m["filter/infra_excluded"] == 0
        assert m["rollout/splits"] == 0
        assert m["train/logprob_diff_max"] < 1e-3
    for r in rollouts:
        assert r["status"] == "ok", r["error"]
        # the dispatcher keeps every retry's reason as a message of role infra_retry
        assert r["counters"]["infra_retries"] == 0
        assert not [m for m in r["messages"] if m["role"] == "infra_retry"]
        assert r["counters"]["splits"] == 0
        # the agent program's: its instructions and tools, every turn a streamed Responses one
        assert r["messages"][0] == {
            "role": "system",
            "content": "Use the tools, then answer with the number only.",
        }
        turns = len(r["turns"])
        assert r["counters"]["responses_requests"] == r["counters"]["streamed_requests"] == turns
        prompt = tokenizer.decode(r["turns"][0]["prompt_ids"])
        assert '"name": "add"' in prompt and '"name": "multiply"' in prompt


def test_openai_agents_agent_calls_both_tools_and_every_turn_trains__fake_policy(
    tmp_path: Path, tokenizer: Any
) -> None:
    metrics, rollouts = _train(
        tmp_path / "run", "plugins=[gateway.forced_two_tools]", "engine.kind=forced_two_tools"
    )
    _check_run(metrics, rollouts, tokenizer)
    for r in rollouts:
        assert len(r["turns"]) == 3 and r["counters"]["sampled_tool_calls"] == 2
        text = tokenizer.decode(r["turns"][-1]["prompt_ids"])  # the tools' results, in order
        assert text.index('{"name": "multiply", "arguments"') < text.index(
            '{"name": "add", "arguments"'
        )
        assert text.count("<tool_response>") == 2
    for step in (1, 2):
        assert sorted(r["reward"] for r in rollouts if r["step"] == step) == [0.0, 1.0]
    for m in metrics:
        # every sample trained: all three turns' tokens were compared
        assert m["train/skipped_samples"] == 0
        trained = sum(
            len(t["completion_ids"]) for r in rollouts if r["step"] == m["step"] for t in r["turns"]
        )
        assert m["train/probed_tokens"] == m["train/trained_tokens"] == trained
