"""A checked weight sync through the engine router: every replica loads the new weights, each
is checked by its own fingerprint, and no request samples until all of them serve the new
version. Real pieces: two `HFEngine` replicas and the trainer on a tiny random Llama."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tiny_llama import VOCAB, random_batch, save_tiny_llama

from conveyor.config import TrainerConfig
from conveyor.engines.base import SampleRequest
from conveyor.engines.hf_local import HFEngine
from conveyor.engines.router import route


def _request(session: str, *prompt: int) -> SampleRequest:
    return SampleRequest(prompt_ids=list(prompt), max_tokens=4, session_id=session)


def test_weight_sync_reaches_every_replica_each_checked_and_sampling_waits_for_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conveyor.trainer.engine import TorchTrainingEngine
    from conveyor.trainer.weight_sync import WeightSyncError, checked_sync

    tiny = save_tiny_llama(tmp_path)
    backend = TorchTrainingEngine(tiny, TrainerConfig(lr=1e-3, device="cpu"))
    replicas = [HFEngine(tiny, eos_token_id=-1) for _ in range(2)]
    router = route(replicas, ["r0", "r1"])
    sync = checked_sync(router, backend, list(range(3, 40)))
    slow = replicas[1]
    original = slow.update_weights
    loads: list[str] = []

    async def slow_update(weights: Any, version: int | None = None) -> float:
        await asyncio.sleep(0.5)  # r1 takes its time: a request for it must not slip in first
        loads.append("r1")
        return await original(weights, version)

    monkeypatch.setattr(slow, "update_weights", slow_update)

    async def go() -> None:
        await router.sample(_request("s0", 5, 6))  # -> r0
        await router.sample(_request("s1", 5, 6))  # -> r1
        assert router.replica_of("s1") == "r1"
        backend.step(random_batch(vocab=VOCAB))
        syncing = asyncio.create_task(sync(1))
        await asyncio.sleep(0.1)  # r0 has loaded, r1 has not
        result = await router.sample(_request("s1", 5, 6))
        assert loads == ["r1"] and result.policy_version == 1  # it waited for every replica
        await syncing
        assert [r.policy_version for r in replicas] == [1, 1] and router.policy_version == 1
        # a replica that does not really load: the check names it
        backend.step(random_batch(seed=1, vocab=VOCAB))
        monkeypatch.setattr(slow.model, "load_state_dict", lambda *a, **k: ([], []))
        with pytest.raises(WeightSyncError, match="version 2 did not take on engine replica r1"):
            await sync(2)

    asyncio.run(go())
    assert backend.policy_version == 2
