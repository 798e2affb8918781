"""The weight group's own pieces, without vLLM: bucket plans and a real gloo
group of two ranks (two threads of this process) moving tensors bit-exactly in buckets."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from conveyor.engines.weight_group import (
    GroupSpec,
    WeightSender,
    open_group,
    plan_buckets,
    receive_plan,
)


def test_buckets_respect_the_size_and_a_big_tensor_goes_alone() -> None:
    named = [
        ("a", torch.zeros(10)),
        ("b", torch.zeros(10)),
        ("big", torch.zeros(100)),
        ("c", torch.zeros(5)),
    ]
    plan = plan_buckets(named, bucket_bytes=80, element_size=4)
    assert plan == [[("a", [10]), ("b", [10])], [("big", [100])], [("c", [5])]]
    with pytest.raises(ValueError, match="positive"):
        plan_buckets(named, 0, 4)


def test_a_gloo_group_moves_bucketed_tensors_exactly_and_casts_to_the_engine_dtype() -> None:
    sender = WeightSender(bucket_mb=0.0005)  # 524 bytes: several buckets
    spec = sender.open(workers=1)
    named = [("w", torch.randn(8, 9)), ("b", torch.randn(300)), ("n", torch.randn(2, 2))]
    received: dict[str, torch.Tensor] = {}
    plans = {dtype: sender.plan(named, dtype) for dtype in ("float32", "bfloat16")}

    def worker() -> None:
        group, _ = open_group(GroupSpec.from_json(spec.to_json()), 1)
        for dtype, plan in plans.items():
            for name, tensor in receive_plan(group, json.loads(json.dumps(plan)), dtype, "cpu"):
                received[f"{dtype}:{name}"] = tensor.clone()

    thread = threading.Thread(target=worker)
    thread.start()
    sender.connect()
    for dtype, plan in plans.items():
        sender.send(named, plan, dtype)
    thread.join(60)
    sender.close()
    assert len(plans["float32"]) > 1
    for name, tensor in named:
        assert torch.equal(received[f"float32:{name}"], tensor)
        # cast before the wire exactly as the engine would cast on load
        assert torch.equal(received[f"bfloat16:{name}"], tensor.to(torch.bfloat16))
