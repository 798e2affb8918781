"""`conveyor bridge check --backend tinker`: our samples through the Tinker SDK's own encoder.

The datums are built with `tinker.types`, wrapped in the `ForwardBackwardRequest` the training
client sends, and posted by the SDK's own HTTP client to an in-memory transport (`sdk_wire`): the
protobuf body it would send to `/forward_backward`. The bytes are decoded back independently and
checked: the shift, dtypes, shapes, advantages zero off the loss mask, and the loss Tinker
computes from those fields (its documented formula, summed) equal to our `policy_loss` on the
same samples, with the current logprobs equal to the behaviour ones and perturbed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import numpy as np

from conveyor.bridges.report import BridgeUnavailable, CheckReport
from conveyor.bridges.tinker import datums as encoding
from conveyor.config.training import LossConfig, LossReduction
from conveyor.trainer.backend import TrainBatch
from conveyor.types import TrainingSample, Trajectory

# relative to the larger of |loss| and the sum of |token terms|: the wire's float32 advantages
# are rounded by 6e-8 each, which advantages of both signs could blow up relative to |loss|
TOLERANCE = 1e-6
REDUCTIONS: tuple[LossReduction, ...] = get_args(LossReduction)


@dataclass(frozen=True)
class WireDatum:
    """One datum as decoded from the request bytes."""

    input_ids: list[int]
    fields: dict[str, np.ndarray]
    dtypes: dict[str, str]
    shapes: dict[str, list[int]]


def tinker_version() -> str:
    """The installed SDK's version; `BridgeUnavailable` when it is missing."""
    try:
        import tinker
    except ImportError as exc:
        raise BridgeUnavailable(
            f"the tinker SDK is not installed here ({exc}); install it with "
            "`pip install tinker==0.38.0` (pure Python)"
        ) from None
    return str(tinker.__version__)


def load_batch(trajectories: Path) -> TrainBatch:
    """Every training sample of the file with an advantage: its trajectory's reward minus the
    file's mean reward; when every reward is equal (the loss would be 0 and prove nothing), a
    fixed alternating pattern instead."""
    samples: list[tuple[TrainingSample, float]] = []
    for line in trajectories.read_text().splitlines():
        if not line.strip():
            continue
        trajectory = Trajectory.model_validate_json(line)
        reward = trajectory.reward if trajectory.reward is not None else 0.0
        samples.extend((s, reward) for s in trajectory.samples() if len(s.input_ids) >= 2)
    if not samples:
        raise ValueError(f"{trajectories} holds no training sample with at least two tokens")
    mean = sum(r for _, r in samples) / len(samples)
    advantages = [r - mean for _, r in samples]
    if all(a == 0.0 for a in advantages):
        advantages = [(-1.0) ** i * (1.0 + i / len(samples)) for i in range(len(samples))]
    return TrainBatch([(s, a) for (s, _), a in zip(samples, advantages, strict=True)])


def encode_request(data: list[Any], plan: encoding.LossPlan) -> bytes:
    """The body the SDK's HTTP client posts to `/forward_backward` for
    `forward_backward(data, plan.loss_fn, ...)` (captured in memory, `sdk_wire`)."""
    from tinker import types

    from conveyor.bridges.tinker.sdk_wire import posted_forward_backward

    loss_fn = "cross_entropy" if plan.loss_fn == "custom" else plan.loss_fn
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=data, loss_fn=loss_fn, loss_fn_config=plan.loss_fn_config or None
        ),
        model_id="conveyor-check",
        seq_id=1,
    )
    posted = posted_forward_backward(request)
    if posted.path != "/api/v1/forward_backward" or "protobuf" not in posted.content_type:
        raise RuntimeError(
            f"the tinker SDK posted {posted.content_type!r} to {posted.path}; this check reads "
            "the protobuf body of /api/v1/forward_backward (tinker 0.38.0)"
        )
    return posted.body


def decode_request(body: bytes) -> tuple[str, dict[str, float], list[WireDatum]]:
    """Loss name, loss config and datums of a serialized request, read with numpy only."""
    from tinker.proto import tinker_public_pb2 as pb

    message = pb.ForwardBackwardRequest.FromString(body)
    dtypes = {pb.DTYPE_FLOAT32: ("float32", np.float32), pb.DTYPE_INT64: ("int64", np.int64)}
    out = []
    for datum in message.data:
        ids: list[int] = []
        for chunk in datum.model_input:
            ids.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
        fields, names, shapes = {}, {}, {}
        for key, tensor in datum.loss_fn_inputs.items():
            name, np_dtype = dtypes.get(tensor.dtype, (f"proto dtype {tensor.dtype}", np.float64))
            names[key] = name
            shapes[key] = list(tensor.shape)
            fields[key] = np.frombuffer(tensor.dense, dtype=np_dtype).reshape(list(tensor.shape))
        out.append(WireDatum(ids, fields, names, shapes))
    return message.loss_fn, dict(message.loss_fn_config), out


def check(trajectories: Path, settings: LossConfig | None = None) -> CheckReport:
    """Encode the file's samples with the Tinker SDK and check them (see the module doc).

    With `settings` None, every reduction is checked under the `ppo` and `importance_sampling`
    mappings and under the custom-loss path (dual clip); else under `settings` alone.
    """
    version = tinker_version()
    return check_batch(load_batch(trajectories), version, settings)


def check_batch(batch: TrainBatch, version: str, settings: LossConfig | None = None) -> CheckReport:
    """`check` of one batch of samples with their advantages."""
    report = CheckReport(backend="tinker", version=version, samples=len(batch.items))
    configs = [settings] if settings is not None else _loss_configs()
    for index, config in enumerate(configs):
        plan = encoding.plan_loss(config)
        data = encoding.batch_datums(batch, config, plan)
        body = encode_request(data, plan)
        loss_fn, loss_config, wire = decode_request(body)
        label = f"{plan.loss_fn},{config.reduction}"
        if index == 0:
            _check_layout(report, batch, wire, custom=plan.loss_fn == "custom")
        _check_advantages(report, label, batch, config, plan, wire)
        sent = "cross_entropy" if plan.loss_fn == "custom" else plan.loss_fn
        report.add(
            f"request[{label}]",
            loss_fn == sent and loss_config == _wire_config(plan) and len(wire) == len(data),
            f"{len(body)} bytes, loss_fn {loss_fn!r}, config {loss_config}, {len(wire)} datums",
        )
        for perturbed in (False, True):
            current = _current_logprobs(batch.samples, wire, perturbed)
            ours, theirs, mass = _losses(batch, config, plan, wire, current)
            rel = abs(theirs - ours) / max(abs(ours), mass, 1e-12)
            report.add(
                f"loss[{label},{'perturbed' if perturbed else 'behaviour'}]",
                rel <= TOLERANCE,
                f"tinker {theirs:.9g} vs policy_loss {ours:.9g} (relative {rel:.2g} of "
                f"max(|loss|, sum of |token terms| {mass:.3g}))",
            )
    return report


def _wire_config(plan: encoding.LossPlan) -> dict[str, float]:
    # the wire carries the loss config as doubles
    return {k: float(v) for k, v in plan.loss_fn_config.items()}


def _loss_configs() -> list[LossConfig]:
    configs = []
    for reduction in REDUCTIONS:
        configs.append(LossConfig(reduction=reduction, dual_clip_c=None))
        configs.append(
            LossConfig(reduction=reduction, dual_clip_c=None, clip_low=1.0, clip_high=float("inf"))
        )
        configs.append(LossConfig(reduction=reduction))  # dual clip: the custom path
    return configs


def _check_layout(
    report: CheckReport, batch: TrainBatch, wire: Sequence[WireDatum], *, custom: bool
) -> None:
    expected_dtypes = {"target_tokens": "int64", "logprobs": "float32", "advantages": "float32"}
    if custom:
        expected_dtypes["weights"] = "float32"  # the loss mask a custom loss counts tokens by
    shift = dtypes = shapes = logprobs = True
    for sample, datum in zip(batch.samples, wire, strict=True):
        ids, n = sample.input_ids, len(sample.input_ids) - 1
        targets = datum.fields.get("target_tokens")
        shift &= datum.input_ids == ids[:-1] and targets is not None and targets.tolist() == ids[1:]
        dtypes &= datum.dtypes == expected_dtypes
        shapes &= len(datum.input_ids) == n and all(s == [n] for s in datum.shapes.values())
        expected = np.asarray(sample.logprobs[1:], dtype=np.float32)
        got = datum.fields.get("logprobs")
        logprobs &= got is not None and np.array_equal(got, expected)
    count = len(wire)
    report.add("shift", shift, f"inputs = ids[:-1], targets = ids[1:] in {count} datums")
    report.add("dtypes", dtypes, f"exactly {expected_dtypes}")
    report.add("shapes", shapes, "model input and every field have len(ids) - 1 entries")
    report.add("behaviour_logprobs", logprobs, "logprobs = float32(sample.logprobs[1:])")


def _check_advantages(
    report: CheckReport,
    label: str,
    batch: TrainBatch,
    config: LossConfig,
    plan: encoding.LossPlan,
    wire: Sequence[WireDatum],
) -> None:
    scales = (
        [1.0] * len(batch.items)
        if plan.loss_fn == "custom"
        else encoding.token_scales(batch.samples, config)
    )
    ok = True
    for (sample, advantage), scale, datum in zip(batch.items, scales, wire, strict=True):
        mask = np.asarray(sample.loss_mask[1:], dtype=bool)
        got = datum.fields["advantages"]
        ok &= bool(np.all(got[~mask] == 0.0))
        ok &= bool(np.all(got[mask] == np.float32(advantage * scale)))
    report.add(
        f"advantages[{label}]",
        ok,
        "advantage x reduction scale on trained tokens, exactly 0 off the loss mask",
    )


def _current_logprobs(
    samples: Sequence[TrainingSample], wire: Sequence[WireDatum], perturbed: bool
) -> list[np.ndarray]:
    rng = random.Random(0)
    out = []
    for datum in wire:
        behaviour = datum.fields["logprobs"].astype(np.float64)
        if perturbed:
            # up to +-0.5 in log space: ratios in [0.6, 1.65] cross both clip bounds
            noise = np.asarray([rng.uniform(-0.5, 0.5) for _ in behaviour])
            out.append(behaviour + noise)
        else:
            out.append(behaviour.copy())
    return out


def _losses(
    batch: TrainBatch,
    config: LossConfig,
    plan: encoding.LossPlan,
    wire: Sequence[WireDatum],
    current: Sequence[np.ndarray],
) -> tuple[float, float, float]:
    """Our `policy_loss` on the padded batch, Tinker's loss from the decoded fields, and the
    sum of the absolute values of its token terms."""
    import torch

    from conveyor.trainer.losses import policy_loss

    samples = batch.samples
    width = max(len(s.input_ids) for s in samples)
    shape = (len(samples), width)
    lp = torch.zeros(shape, dtype=torch.float64)
    old = torch.zeros(shape, dtype=torch.float64)
    mask = torch.zeros(shape, dtype=torch.bool)
    adv = torch.tensor([a for _, a in batch.items], dtype=torch.float64)
    for i, (sample, row) in enumerate(zip(samples, current, strict=True)):
        n = len(sample.input_ids)
        # the behaviour logprobs as the wire carries them (float32), so only the reduction and
        # the loss formula are compared, not float32 rounding of the inputs
        old[i, 1:n] = torch.from_numpy(np.asarray(sample.logprobs[1:], dtype=np.float32)).double()
        lp[i, 1:n] = torch.from_numpy(row)
        mask[i, :n] = torch.tensor(sample.loss_mask, dtype=torch.bool)
    ours = float(policy_loss(lp, old, adv, mask, config)[0])
    from tinker import types

    rebuilt = [
        types.Datum(
            model_input=types.ModelInput.from_ints(d.input_ids),
            loss_fn_inputs={k: types.TensorData.from_numpy(v) for k, v in d.fields.items()},
        )
        for d in wire
    ]
    if plan.loss_fn != "custom":
        terms = encoding.builtin_loss_terms(plan, current, rebuilt)
        theirs = float(sum(t.sum() for t in terms))
        return ours, theirs, float(sum(np.abs(t).sum() for t in terms))
    tensors = [torch.from_numpy(np.asarray(row, dtype=np.float64)) for row in current]
    custom, _ = encoding.padded_policy_loss(rebuilt, tensors, config)
    return ours, float(custom), 0.0
