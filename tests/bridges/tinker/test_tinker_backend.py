"""TinkerBackend, the tinker engine and TinkerSpec against stand-ins for the Tinker service.

The service is unreachable here, so every `fake_service` object below stands in for the SDK's
training or sampling client: it records the real `tinker.types` objects our code hands it and
answers with real `tinker.types` responses.
"""

from __future__ import annotations

import asyncio
import json
import math
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor.bridges.tinker import TinkerBackend, TinkerSamplingClient, TinkerSpec
from conveyor.bridges.tinker.datums import TinkerLossUnsupported
from conveyor.bridges.tinker.sampling import build_tinker_engine
from conveyor.config import ConveyorConfig, TrainerConfig
from conveyor.engines.base import EngineError, SampleRequest
from conveyor.registry import BACKENDS, ENGINES
from conveyor.trainer.backend import BackendUnavailable, TrainBatch
from conveyor.trainer.weight_sync import checked_sync
from conveyor.types import FinishReason, TrainingSample

tinker = pytest.importorskip("tinker")
types = tinker.types


def done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


def fake_logprobs(ids: list[int], shift: float) -> np.ndarray:
    """A deterministic 'model': the logprob of target t depends on its id and the weights."""
    return np.asarray([-(t % 7) / 7.0 - 0.1 - shift for t in ids], dtype=np.float32)


class FakeServiceTrainingClient:
    """Stands in for `tinker.TrainingClient`: records calls, 'trains' by moving `shift`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.shift = 0.0
        self.saved: dict[str, float] = {}

    def _output(self, data: list[Any]) -> Any:
        outputs = [
            {"logprobs": types.TensorData.from_numpy(
                fake_logprobs(d.loss_fn_inputs["target_tokens"].tolist(), self.shift)
            )}
            for d in data
        ]  # fmt: skip
        return types.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics={"loss:sum": 0.25}
        )

    def forward_backward(self, data: list[Any], loss_fn: str, config: Any = None) -> Future[Any]:
        self.calls.append(("forward_backward", (data, loss_fn, config)))
        return done(self._output(data))

    def forward_backward_custom(self, data: list[Any], loss_fn: Any) -> Future[Any]:
        import torch

        self.calls.append(("forward_backward_custom", (data, loss_fn)))
        out = self._output(data)
        logprobs = [
            torch.tensor(o["logprobs"].tolist(), requires_grad=True) for o in out.loss_fn_outputs
        ]
        loss, _ = loss_fn(data, logprobs)
        loss.backward()
        self.custom_grads = [lp.grad for lp in logprobs]
        return done(out)

    def forward(self, data: list[Any], loss_fn: str, config: Any = None) -> Future[Any]:
        self.calls.append(("forward", (data, loss_fn)))
        return done(self._output(data))

    def optim_step(self, params: Any) -> Future[Any]:
        self.calls.append(("optim_step", params))
        self.shift += 0.5
        return done(types.OptimStepResponse(metrics={"grad_norm": 1.5}))

    def save_weights_for_sampler(self, name: str) -> Future[Any]:
        path = f"tinker://run/sampler_weights/{name}"
        self.saved[path] = self.shift
        return done(types.SaveWeightsForSamplerResponse(path=path))

    def create_sampling_client(self, path: str) -> Future[Any]:
        return done(FakeServiceSamplingClient(self.saved[path]))

    def save_state(self, name: str) -> Future[Any]:
        self.calls.append(("save_state", name))
        return done(types.SaveWeightsResponse(path=f"tinker://run/weights/{name}"))

    def load_state_with_optimizer(self, path: str) -> Future[Any]:
        self.calls.append(("load_state_with_optimizer", path))
        return done(types.LoadWeightsResponse(path=path))


class FakeServiceSamplingClient:
    """Stands in for `tinker.SamplingClient` serving the weights at `shift`."""

    def __init__(self, shift: float = 0.0) -> None:
        self.shift = shift
        self.requests: list[tuple[Any, Any]] = []

    def sample(self, prompt: Any, num_samples: int, sampling_params: Any) -> Future[Any]:
        self.requests.append((prompt, sampling_params))
        tokens = np.asarray([5, 6, 2], dtype=np.int32)
        sequence = types.SampledSequence(
            stop_reason="stop",
            sequence_id="s0",
            tokens_np=tokens,
            logprobs_np=np.asarray([-0.5, -0.25, -0.125], dtype=np.float32),
        )
        return done(types.SampleResponse(sequences=[sequence]))

    def compute_logprobs(self, prompt: Any) -> Future[Any]:
        ids = prompt.to_ints()
        return done([None, *(float(x) for x in fake_logprobs(ids[1:], self.shift))])


def batch() -> TrainBatch:
    def sample(ids: list[int], trained: int) -> TrainingSample:
        n = len(ids)
        mask = [0] * (n - trained) + [1] * trained
        logprobs = [0.0, *(float(x) for x in fake_logprobs(ids[1:], 0.0))]
        return TrainingSample(
            input_ids=ids, loss_mask=mask, logprobs=logprobs, prompt_length=n - trained
        )

    return TrainBatch([(sample([1, 2, 3, 4, 5, 6], 3), 1.0), (sample([7, 8, 9, 10], 2), -1.0)])


def trainer(**loss: Any) -> TrainerConfig:
    return TrainerConfig(
        lr=3e-5,
        betas=[0.8, 0.95],
        eps=1e-7,
        weight_decay=0.01,
        max_grad_norm=2.0,
        loss={"options": loss},
    )


def test_step_sends_ppo_datums_then_adam_params_from_config_fake_service() -> None:
    client = FakeServiceTrainingClient()
    backend = TinkerBackend(client, trainer(dual_clip_c=None, clip_low=0.1, clip_high=0.3))
    result = backend.step(batch())
    (kind, (data, loss_fn, config)), (opt_kind, params) = client.calls
    assert kind == "forward_backward" and opt_kind == "optim_step"
    assert loss_fn == "ppo"
    assert config == pytest.approx({"clip_low_threshold": 0.9, "clip_high_threshold": 1.3})
    assert [d.model_input.to_ints() for d in data] == [[1, 2, 3, 4, 5], [7, 8, 9]]
    assert data[0].loss_fn_inputs["target_tokens"].tolist() == [2, 3, 4, 5, 6]
    # token_mean over 5 trained tokens: +1/5 on sample 0's 3 tokens, -1/5 on sample 1's 2
    assert data[0].loss_fn_inputs["advantages"].tolist() == pytest.approx([0, 0, 0.2, 0.2, 0.2])
    assert data[1].loss_fn_inputs["advantages"].tolist() == pytest.approx([0, -0.2, -0.2])
    assert isinstance(params, types.AdamParams)
    assert (params.learning_rate, params.beta1, params.beta2) == (3e-5, 0.8, 0.95)
    assert (params.eps, params.weight_decay, params.grad_clip_norm) == (1e-7, 0.01, 2.0)
    assert result.policy_version == backend.policy_version == 1
    assert (result.loss, result.grad_norm, result.lr) == (0.25, 1.5, 3e-5)
    assert result.trained_tokens == 5 and result.tokens == 10
    assert result.logprob_diff_max == pytest.approx(0.0, abs=1e-6)  # service = behaviour here


def test_sdk_posts_our_adam_params_as_the_optim_step_body() -> None:
    from conveyor.bridges.tinker.backend import adam_params
    from conveyor.bridges.tinker.sdk_wire import posted_optim_step

    posted = posted_optim_step(adam_params(trainer()))
    assert posted.path == "/api/v1/optim_step" and posted.content_type == "application/json"
    assert json.loads(posted.body)["adam_params"] == {
        "learning_rate": 3e-5,
        "beta1": 0.8,
        "beta2": 0.95,
        "eps": 1e-7,
        "weight_decay": 0.01,
        "grad_clip_norm": 2.0,
    }


def test_default_loss_runs_policy_loss_through_forward_backward_custom_fake_service() -> None:
    client = FakeServiceTrainingClient()
    backend = TinkerBackend(client, trainer())  # dual clip on: no built-in loss has it
    backend.step(batch())
    assert [c[0] for c in client.calls] == ["forward_backward_custom", "optim_step"]
    grads = client.custom_grads
    # token_mean: d loss / d logprob = -A / 5 on trained tokens (ratio 1), 0 elsewhere
    assert grads[0].tolist() == pytest.approx([0, 0, -0.2, -0.2, -0.2])
    assert grads[1].tolist() == pytest.approx([0, 0.2, 0.2])


def test_kl_runs_in_the_custom_loss_with_reference_logprobs_fake_service() -> None:
    client = FakeServiceTrainingClient()
    backend = TinkerBackend(client, trainer(dual_clip_c=None, kl_coef=0.5, kl_estimator="k1"))
    with pytest.raises(ValueError, match="ref_logprobs"):
        backend.step(batch())
    plain = batch()
    # reference = behaviour: k1 = lp - ref, so d/dlp adds kl_coef / 5 per trained token
    with_ref = TrainBatch(plain.items, ref_logprobs=[s.logprobs for s in plain.samples])
    backend.step(with_ref)
    assert client.calls[0][0] == "forward_backward_custom"
    assert client.custom_grads[0].tolist() == pytest.approx([0, 0, -0.1, -0.1, -0.1])
    assert client.custom_grads[1].tolist() == pytest.approx([0, 0.3, 0.3])


def test_tis_is_refused_with_the_key_named() -> None:
    with pytest.raises(TinkerLossUnsupported, match="tis"):
        TinkerBackend(FakeServiceTrainingClient(), trainer(tis=True))


def test_save_load_keep_the_service_path_and_version_fake_service(tmp_path: Path) -> None:
    client = FakeServiceTrainingClient()
    backend = TinkerBackend(client, trainer(dual_clip_c=None))
    backend.step(batch())
    backend.save(tmp_path / "ckpt")
    state = json.loads((tmp_path / "ckpt" / "tinker_state.json").read_text())
    assert state == {"tinker_path": "tinker://run/weights/conveyor-state-v1", "policy_version": 1}
    fresh = TinkerBackend(client, trainer(dual_clip_c=None))
    fresh.load(tmp_path / "ckpt")
    assert fresh.policy_version == 1
    assert client.calls[-1] == ("load_state_with_optimizer", state["tinker_path"])
    with pytest.raises(FileNotFoundError, match="tinker"):
        fresh.load(tmp_path / "nothing")
    with pytest.raises(NotImplementedError, match="Tinker service"):
        fresh.export_weights()


def test_checked_sync_points_the_engine_at_new_weights_fake_service() -> None:
    client = FakeServiceTrainingClient()
    backend = TinkerBackend(client, trainer(dual_clip_c=None))
    engine = TinkerSamplingClient(FakeServiceSamplingClient(), base_model="base")
    sync = checked_sync(engine, backend, [3, 4, 5, 6])
    backend.step(batch())
    asyncio.run(sync(step=1))
    assert engine.policy_version == 1
    assert engine.model_path == "tinker://run/sampler_weights/conveyor-v1"
    got = asyncio.run(engine.sample(SampleRequest(prompt_ids=[1, 2], max_tokens=4)))
    assert got.policy_version == 1
    # a sampler left on old weights is caught by the probe
    backend.step(batch())
    engine.use_sampler(FakeServiceSamplingClient(0.0), "stale", backend.policy_version)
    from conveyor.trainer.weight_sync import WeightSyncError, check_fingerprint

    served = asyncio.run(engine.weight_fingerprint([3, 4, 5, 6]))
    with pytest.raises(WeightSyncError, match="probe"):
        check_fingerprint(served, backend.weight_fingerprint(served, [3, 4, 5, 6]), 2)


def test_compute_logprobs_is_aligned_with_input_ids_fake_service() -> None:
    backend = TinkerBackend(FakeServiceTrainingClient(), trainer(dual_clip_c=None))
    rows = backend.compute_logprobs(batch().samples)
    assert [len(r) for r in rows] == [6, 4] and rows[0][0] == 0.0
    assert rows[0][1:] == pytest.approx(fake_logprobs([2, 3, 4, 5, 6], 0.0).tolist())


def test_engine_maps_request_and_response_fake_service() -> None:
    service = FakeServiceSamplingClient()
    engine = TinkerSamplingClient(service, base_model="base")
    request = SampleRequest(
        prompt_ids=[1, 2, 3], max_tokens=8, temperature=0.7, top_p=0.9, seed=3, stop_token_ids=[2]
    )
    result = asyncio.run(engine.sample(request))
    assert result.token_ids == [5, 6, 2] and result.logprobs == [-0.5, -0.25, -0.125]
    assert result.finish_reason is FinishReason.STOP and result.policy_version == 0
    prompt, params = service.requests[0]
    assert prompt.to_ints() == [1, 2, 3]
    assert (params.max_tokens, params.temperature, params.top_p, params.seed) == (8, 0.7, 0.9, 3)
    assert list(params.stop) == [2]
    fingerprint = asyncio.run(engine.weight_fingerprint([1, 2, 3]))
    assert fingerprint.probe_logprobs[0] == 0.0 and len(fingerprint.probe_logprobs) == 3


def config(sampling: dict[str, Any] | None = None, **engine: Any) -> ConveyorConfig:
    return ConveyorConfig.model_validate(
        {
            "engine": {"kind": "tinker", **engine},
            "trainer": {"backend": "tinker"},
            "sampling": sampling or {},
        }
    )


def test_engine_and_backend_need_the_api_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert ENGINES.get("tinker") is build_tinker_engine
    with pytest.raises(EngineError, match=r"\$TINKER_API_KEY"):
        build_tinker_engine(config(served_model_name="Qwen/Qwen3-4B"), tmp_path)
    spec = BACKENDS.spec("tinker")
    assert spec.sampler == "tinker"
    info = spec.info()
    assert info.version == "0.38.0" and not info.train and "TINKER_API_KEY" in info.reason
    with pytest.raises(BackendUnavailable, match="TINKER_API_KEY"):
        spec.build(config(), tmp_path, TrainerConfig(loss={"options": {"dual_clip_c": None}}))
    monkeypatch.setenv("TINKER_API_KEY", "k")
    with pytest.raises(BackendUnavailable, match="served_model_name"):
        spec.build(config(), tmp_path, TrainerConfig())


def test_spec_refuses_engines_other_than_tinker() -> None:
    spec = TinkerSpec()
    engine = TinkerSamplingClient(FakeServiceSamplingClient(), base_model="base")
    hot = spec.refusal(config(sampling={"temperature": 0.7}), engine)
    assert hot is not None and "sampling.temperature 1.0" in hot
    assert spec.refusal(config(sampling={"temperature": 1.0}), engine) is None
    message = spec.refusal(config(), object())
    assert message is not None and "needs engine.kind tinker" in message


def test_importance_sampling_needs_an_unbounded_clip() -> None:
    backend = TinkerBackend(
        FakeServiceTrainingClient(), trainer(dual_clip_c=None, clip_low=1.0, clip_high=math.inf)
    )
    assert backend.loss_plan.loss_fn == "importance_sampling"
