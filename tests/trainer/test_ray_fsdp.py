"""`trainer.backend: ray_fsdp` on a local Ray: two worker actors (FSDP2 over gloo) make the same
updates as one process, export the same weights, checkpoint and resume, and a lost worker stops
the trainer with one error instead of leaving the other rank waiting in a collective."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from tiny_llama import random_batch, save_tiny_llama

from conveyor.config import ConveyorConfig, TrainerConfig
from conveyor.config.base import PartChoice
from conveyor.config.cluster import ClusterConfig
from conveyor.engines.base import WeightFingerprint
from conveyor.registry import BACKENDS
from conveyor.trainer.checkpoint import load_checkpoint, save_checkpoint
from conveyor.trainer.engine import TorchTrainingEngine

SETTINGS = TrainerConfig(lr=1e-3, micro_batch_tokens=30, device="cpu", seed=0)


def alive_actors() -> list[str]:
    """Class names of the actors Ray's actor table (GCS) does not list as dead."""
    from ray._private.state import actors

    return [a["ActorClassName"] for a in actors().values() if a["State"] != "DEAD"]


@pytest.mark.slow
def test_two_ray_workers_train_like_one_process_and_stop_together(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    from conveyor.dispatch.ray_cluster import connect
    from conveyor.trainer.ray_fsdp import RayFsdpTrainer, TrainerWorkerError

    folder = save_tiny_llama(tmp_path / "tiny")
    batches = [random_batch(n=7, seed=22), random_batch(n=5, seed=23)]
    probe = batches[0].samples[:3]
    like = WeightFingerprint(policy_version=0, digests={"model.norm.weight": ""})
    probe_ids = list(probe[0].input_ids)
    single = TorchTrainingEngine(folder, SETTINGS)
    expected = [single.step(batches[0])]
    logprobs_after_one = single.compute_logprobs(probe)
    fingerprint_after_one = single.weight_fingerprint(like, probe_ids)
    expected.append(single.step(batches[1]))
    reference = dict(single.export_weights())

    placement = ClusterConfig(address="local", trainer_workers=2)
    config = ConveyorConfig(
        cluster=placement,
        trainer=SETTINGS.model_copy(update={"backend": PartChoice(name="ray_fsdp")}),
    )
    cluster = connect(placement, trainer_workers=2)
    try:
        trainer = BACKENDS.spec("ray_fsdp").build(config, folder, config.trainer)
        assert isinstance(trainer, RayFsdpTrainer) and len(trainer.workers) == 2
        saved = None
        for step, (batch, want) in enumerate(zip(batches, expected, strict=True), start=1):
            got = trainer.step(batch)
            assert got.loss == pytest.approx(want.loss, abs=1e-6)
            # Adam hides a gradient scale error in the weights; the norm does not
            assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-5)
            if step == 1:
                # as the RL loop does: the sync's check (a forward-only pass), then a
                # collective save into the folder the driver names
                fingerprint = trainer.weight_fingerprint(like, probe_ids)
                assert fingerprint.policy_version == 1
                assert fingerprint.digests.keys() == {"model.norm.weight"}
                assert fingerprint.probe_logprobs == pytest.approx(
                    fingerprint_after_one.probe_logprobs, abs=1e-5
                )
                saved = save_checkpoint(tmp_path / "run", step, trainer, {"cursor": 2})
                after_one = dict(trainer.export_weights())
        assert trainer.policy_version == 2
        weights = dict(trainer.export_weights())
        assert weights.keys() == reference.keys()
        for name, tensor in reference.items():
            torch.testing.assert_close(weights[name], tensor, atol=1e-5, rtol=0)
        # (loaded before any forward-only pass: FSDP2 leaves the root unsharded after one, and
        # the state-dict load wants it sharded; the RL loop loads into fresh workers)
        assert saved is not None
        assert load_checkpoint(saved, trainer) == {"cursor": 2}
        assert trainer.policy_version == 1
        for name, tensor in trainer.export_weights():
            assert torch.equal(tensor, after_one[name])
        for row, want_row in zip(trainer.compute_logprobs(probe), logprobs_after_one, strict=True):
            assert row == pytest.approx(want_row, abs=1e-5)

        # rank 1 dies: the step fails at once and rank 0 (in a collective) is stopped too
        ray.kill(trainer.workers[1], no_restart=True)
        started = time.monotonic()
        with pytest.raises(TrainerWorkerError, match="trainer worker was lost"):
            trainer.step(batches[0])
        assert time.monotonic() - started < 60
        assert trainer.workers == []
        for _ in range(100):  # ray.kill is asynchronous
            if not alive_actors():
                break
            time.sleep(0.2)
        assert alive_actors() == []
    finally:
        cluster.shutdown()
    assert not ray.is_initialized()
