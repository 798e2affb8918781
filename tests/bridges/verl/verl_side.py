"""Run inside .venv-verl by test_verl_agent_loop.py: VeRL's dataset class reads our exported
parquet, and VeRL's own instantiation path builds our `conveyor` agent loop, whose `run` samples
through a fake server manager (no GPU, so no VeRL rollout server: it forwards each
`generate` to one of our real sampling clients). Prints one JSON line: the dataset rows seen,
each rollout's AgentLoopOutput and every generate call.

    python verl_side.py OUT_DIR MODEL_DIR CONFIG_JSON
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.utils import hf_tokenizer
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

from conveyor.bridges.verl.agent_loop import VerlSamplingClient
from conveyor.bridges.verl.dataset import export_dataset
from conveyor.config import ConveyorConfig
from conveyor.engines.base import EngineError, SampleRequest, SamplingClient
from conveyor.engines.hf_local import HFEngine
from conveyor.tasks.family import build_families
from conveyor.trainer.sft import OracleEngine
from conveyor.types import Task


class FakeServerManager:
    """VeRL's `server_manager.generate` over one of our sampling clients; records each call."""

    def __init__(self, client: SamplingClient, session: str) -> None:
        self.client = client
        self.session = session
        self.calls: list[dict[str, Any]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> TokenOutput:
        result = await self.client.sample(
            SampleRequest(
                prompt_ids=prompt_ids,
                max_tokens=sampling_params["max_tokens"],
                temperature=sampling_params["temperature"],
                session_id=self.session,
            )
        )
        self.calls.append(
            {
                "request_id": request_id,
                "prompt_ids": list(prompt_ids),
                "sampling_params": sampling_params,
                "token_ids": result.token_ids,
                "log_probs": result.logprobs,
            }
        )
        return TokenOutput(
            token_ids=result.token_ids, log_probs=result.logprobs, stop_reason="completed"
        )


def trainer_config(prompt_length: int, response_length: int) -> Any:
    """The parts of VeRL's trainer config an agent loop reads."""
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"prompt_length": prompt_length, "response_length": response_length}
            },
            "data": {"prompt_key": "prompt", "max_prompt_length": prompt_length},
        }
    )


async def rollout(
    row: dict[str, Any], manager: FakeServerManager, tokenizer: Any, config: Any
) -> dict[str, Any]:
    """Our agent loop built the way VeRL's worker builds it, run on one dataset row."""
    loop = hydra.utils.instantiate(
        config=_agent_loop_registry[row["agent_name"]],
        trainer_config=DictConfigWrap(config=config),
        server_manager=manager,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="llama",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )
    kwargs = {k: v for k, v in row.items() if k not in ("agent_name", "dummy_tensor")}
    params = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
    output = await loop.run(params, **kwargs)
    return {"output": output.model_dump(), "calls": manager.calls}


class CannedServerManager:
    """A server manager that answers every request with one canned `TokenOutput`."""

    def __init__(self, output: TokenOutput) -> None:
        self.output = output

    async def generate(self, request_id: str, **kwargs: Any) -> TokenOutput:
        return self.output


def client_answers() -> dict[str, str]:
    """What our sampling client makes of server answers: finish reasons, or the error."""
    request = SampleRequest(prompt_ids=[1, 2], max_tokens=2)
    answers: dict[str, str] = {}
    for name, output in {
        "short": TokenOutput(token_ids=[5], log_probs=[-0.5], stop_reason="completed"),
        "full": TokenOutput(token_ids=[5, 6], log_probs=[-0.5, -0.1], stop_reason="completed"),
        "aborted": TokenOutput(token_ids=[5], log_probs=[-0.5], stop_reason="aborted"),
        "no_logprobs": TokenOutput(token_ids=[5, 6], log_probs=None),
        "short_logprobs": TokenOutput(token_ids=[5, 6], log_probs=[-0.5]),
    }.items():
        client = VerlSamplingClient(CannedServerManager(output), {"temperature": 1.0}, "r")
        try:
            answers[name] = str(asyncio.run(client.sample(request)).finish_reason)
        except EngineError as exc:
            answers[name] = f"EngineError: {exc}"
    return answers


def main() -> None:
    out_dir, model_dir, config_json = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    config = ConveyorConfig.model_validate_json(Path(config_json).read_text())
    parquet = out_dir / "tasks.parquet"
    written = export_dataset(config, parquet, split="eval", n=1)
    tokenizer = hf_tokenizer(model_dir)
    verl_config = trainer_config(4096, 4096)
    dataset = RLHFDataset(str(parquet), tokenizer, verl_config.data)
    rows = [dataset[i] for i in range(len(dataset))]
    families = build_families(config.tasks.families, config.runtime)
    tasks = [Task.model_validate_json(r["extra_info"]["task"]) for r in rows]
    oracle = OracleEngine(
        {t.id: families[t.family].oracle_calls(t) for t in tasks},
        lambda text: tokenizer.encode(text, add_special_tokens=False),
        tokenizer.eos_token_id,
        config.model.tool_format,
    )
    engine = HFEngine(model_dir)
    results: dict[str, Any] = {
        "written": written,
        "rows": [],
        "oracle": [],
        "sampled": [],
        "answers": client_answers(),
    }
    for row, task in zip(rows, tasks, strict=True):
        results["rows"].append(
            {
                "agent_name": row["agent_name"],
                "data_source": row["data_source"],
                "raw_prompt": list(row["raw_prompt"]),
                "index": int(row["index"]),
                "task": row["extra_info"]["task"],
            }
        )
        for kind, client in (("oracle", oracle), ("sampled", engine)):
            manager = FakeServerManager(client, f"{task.id}/0")
            results[kind].append(
                asyncio.run(rollout(row, manager, tokenizer, verl_config)) | {"task": task.id}
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
