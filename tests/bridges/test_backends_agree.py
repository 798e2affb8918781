"""Issue 16's identity check: one task set, greedy, hints off, on three samplers of the same
weights — in-process vLLM, a vLLM server process, and the recording gateway driven by a plain
`openai`-SDK agent (examples/sdk_agent.py, no conveyor imports) — gives identical ids every
turn, logprobs within 1e-3 and equal pass@1, as `conveyor bridge compare` judges it.

Everything is real: the embedded model, vLLM in-process and as a server, the SDK, the
quickstart family's sandboxes and grading.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servers import vllm_server

REPO = Path(__file__).resolve().parents[2]
# The quickstart families (filenav), 20 held-out tasks, one greedy rollout each, hints off.
COMMON = [
    "tasks.num_tasks=20",
    "tasks.group_size=1",
    "tasks.split=eval",
    "sampling.temperature=0",
    "agent.hints.enabled=false",
    "engine.max_num_seqs=8",
    "dispatch.p_run=8",
    "dispatch.max_parallel=8",
]


def _eval(run_dir: Path, *overrides: str) -> None:
    sets = [a for key in (*COMMON, *overrides, f"run.dir={run_dir}") for a in ("--set", key)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor.cli",
            "eval",
            str(REPO / "configs/quickstart.yaml"),
            *sets,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.mark.slow
def test_in_process_vllm_a_vllm_server_and_the_sdk_agent_through_the_gateway_agree(
    model_dir: Path, tmp_path: Path
) -> None:
    in_process, server, gateway = tmp_path / "vllm", tmp_path / "server", tmp_path / "gateway"
    _eval(in_process)
    agent = json.dumps([sys.executable, str(REPO / "examples" / "sdk_agent.py")])
    _eval(gateway, f"agent.external_command={agent}")
    with vllm_server(model_dir, max_num_seqs=8, log=tmp_path / "server.log") as url:
        _eval(server, "engine.kind=openai", f"engine.base_url={url}")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "conveyor.cli", "bridge", "compare"),
            *(str(in_process), str(server), str(gateway), "--tol", "1e-3", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, result
    assert result["identical_ids"] is True and result["first_mismatch"] is None
    assert result["max_abs_logprob_diff"] <= 1e-3
    assert result["turns"] >= 2 * 20  # every rollout of both other runs compared with the first
    assert len(set(result["pass_at_1"])) == 1
