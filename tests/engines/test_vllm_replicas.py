"""`engine.replicas`' server launcher when a replica does not come up: one message naming it
and the end of its log, and the replicas already started are stopped (process group and all).

The server command is replaced by small real programs (one prints and exits, one never
answers, one spawns a child as vLLM's engine core would): what is tested is the launcher's
handling of real processes, not vLLM (tests/engines/test_router_vllm.py starts real servers).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conveyor.engines import vllm_replicas
from conveyor.engines.base import EngineError
from processes import alive


def test_a_replica_that_exits_at_start_is_named_and_the_others_are_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    started: list[int] = []

    def fake_command(model_dir: Path, port: int, **_: Any) -> list[str]:
        started.append(port)
        if len(started) == 1:  # never answers; its child stands for vLLM's engine core
            script = (
                "import os, subprocess, sys, time; "
                "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                f"open(os.path.join({str(pids)!r}, 'child'), 'w').write(str(child.pid)); "
                "time.sleep(60)"
            )
        else:
            script = "print('CUDA out of memory (pretend)'); raise SystemExit(3)"
        return [sys.executable, "-c", script]

    monkeypatch.setattr(vllm_replicas, "server_command", fake_command)
    begin = time.monotonic()
    with pytest.raises(EngineError) as caught:
        vllm_replicas.start_replicas(
            tmp_path,
            2,
            max_num_seqs=4,
            max_model_len=512,
            kv_cache_gib=1,
            dtype="auto",
            seed=0,
            extra_args=[],
            client_options={},
            start_timeout_s=60,
        )
    message = str(caught.value)
    url = f"http://127.0.0.1:{started[1]}/v1"
    assert message.startswith(f"engine replica 1 (a vLLM server at {url}) exited")
    assert "with code 3" in message and message.endswith("CUDA out of memory (pretend)")
    assert time.monotonic() - begin < 30  # noticed when it exited, not at the start timeout
    child = int((pids / "child").read_text())
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)  # the whole process group of the other replica is gone
    assert not vllm_replicas._RUNNING
