"""Engines are built by the name `engine.kind` gives, through the engine registry."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conveyor.config import ConveyorConfig, EngineConfig, load_config
from conveyor.engines.base import SampleRequest, SampleResult, SamplingClient, WeightReceiver
from conveyor.engines.factory import build_engine, load_tokenizer
from conveyor.engines.simulated import SimulatedEngine
from conveyor.registry import ENGINES, UnknownName
from conveyor.types import StopReason


def _config(kind: str, **engine: object) -> ConveyorConfig:
    # model_construct: the factory itself must not rely on config validation (the unknown-kind
    # test hands it a name that validation would refuse first)
    return ConveyorConfig.model_construct(engine=EngineConfig.model_construct(kind=kind, **engine))


def test_every_built_in_kind_is_registered() -> None:
    assert {"vllm", "openai", "simulated", "hf"} <= set(ENGINES.names())


def test_engine_kind_hf_builds_the_transformers_sampler_and_generates(model_dir: Path) -> None:
    from conveyor.engines.hf_local import HFEngine

    engine = build_engine(_config("hf", request_timeout_s=120.0), model_dir)
    assert isinstance(engine, HFEngine)
    assert isinstance(engine, WeightReceiver)  # it can be trained: `conveyor train` accepts it
    tokenizer = load_tokenizer(model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hello."}], add_generation_prompt=True, tokenize=False
    )
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    request = SampleRequest(prompt_ids=prompt, max_tokens=8, temperature=0.0)
    result = asyncio.run(engine.sample(request))
    assert 1 <= len(result.token_ids) <= 8
    assert len(result.logprobs) == len(result.token_ids)
    assert all(lp <= 0.0 for lp in result.logprobs)
    assert result.finish_reason in (StopReason.STOP, StopReason.LENGTH)
    assert tokenizer.decode(result.token_ids).strip()  # real text from the real model


def test_engine_kind_simulated_samples_from_the_model_vocabulary(model_dir: Path) -> None:
    engine = build_engine(_config("simulated"), model_dir)
    assert isinstance(engine, SimulatedEngine)
    tokenizer = load_tokenizer(model_dir)
    assert engine.eos_token_id == tokenizer.eos_token_id
    assert engine.vocab_hi == len(tokenizer)
    assert not isinstance(engine, WeightReceiver)  # it has no weights to take


def test_an_unknown_kind_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownName, match=r"unknown engine kind 'hff'.*did you mean 'hf'"):
        build_engine(_config("hff"), tmp_path)


def test_the_openai_engine_asks_for_the_served_model_name(tmp_path: Path) -> None:
    """`engine.served_model_name` is the name requests carry; without it, the folder's path
    (what a server started with `--model PATH` serves)."""
    request = SampleRequest(prompt_ids=[1, 2], max_tokens=4)
    base = ["engine.kind=openai", "engine.base_url=http://127.0.0.1:9/v1"]
    named = load_config(None, [*base, "engine.served_model_name=smol"]).config
    assert build_engine(named, tmp_path).payload(request)["model"] == "smol"  # type: ignore[attr-defined]
    plain = load_config(None, base).config
    assert build_engine(plain, tmp_path).payload(request)["model"] == str(tmp_path)  # type: ignore[attr-defined]


class _EchoEngine:
    """A user's engine registered from a test module: returns the prompt's last token."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.in_flight = 0
        self.policy_version = 0

    async def sample(self, request: SampleRequest) -> SampleResult:
        return SampleResult(
            token_ids=request.prompt_ids[-1:], logprobs=[0.0], finish_reason=StopReason.STOP
        )

    async def close(self) -> None:
        pass


@ENGINES.register("test_echo")
def build_echo(config: ConveyorConfig, model_dir: Path) -> SamplingClient:
    """The registration a user's plugin module makes."""
    return _EchoEngine(model_dir)


def test_a_user_registered_kind_is_built_by_name(tmp_path: Path) -> None:
    engine = build_engine(_config("test_echo"), tmp_path)
    assert isinstance(engine, _EchoEngine) and engine.model_dir == tmp_path
    result = asyncio.run(engine.sample(SampleRequest(prompt_ids=[5, 7], max_tokens=1)))
    assert result.token_ids == [7]
