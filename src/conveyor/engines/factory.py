"""Build the sampling client and tokenizer a config names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from conveyor.config import ConveyorConfig
from conveyor.engines.base import SamplingClient
from conveyor.models import ModelError

# What the engine registry (`conveyor.registry.ENGINES`) holds: config + model folder -> client.
EngineBuilder = Callable[[ConveyorConfig, Path], SamplingClient]


def load_tokenizer(model_dir: Path) -> Any:
    """The model folder's Hugging Face tokenizer (local files only; nothing is downloaded)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"cannot load the tokenizer of {model_dir}: {exc}; fix: point model.path at a "
            "complete Hugging Face model folder, or run `conveyor models prepare`"
        ) from exc


def build_engine(config: ConveyorConfig, model_dir: Path) -> SamplingClient:
    """The engine of `config.engine.kind`, serving the model in `model_dir`."""
    engine = config.engine
    if engine.kind == "vllm":
        from conveyor.engines.vllm_local import VLLMEngine

        return VLLMEngine(
            model_dir,
            max_num_seqs=engine.max_num_seqs,
            max_model_len=config.agent.max_context_tokens,
            kv_cache_gib=engine.kv_cache_gib,
            dtype=engine.dtype,
            seed=config.sampling.sampling_seed or 0,
            request_timeout_s=engine.request_timeout_s,
        )
    if engine.kind == "openai":
        from conveyor.engines.openai_http import OpenAICompatibleClient

        assert engine.base_url is not None  # the config validator requires it
        return OpenAICompatibleClient(
            engine.base_url,
            str(model_dir),
            api_key_env=engine.api_key_env,
            timeout_s=engine.request_timeout_s,
            connect_timeout_s=engine.connect_timeout_s,
            max_connections=engine.max_connections,
            reconnect_s=engine.reconnect_s,
        )
    from conveyor.engines.simulated import SimulatedEngine

    tokenizer = load_tokenizer(model_dir)
    return SimulatedEngine(
        eos_token_id=tokenizer.eos_token_id,
        seed=config.sampling.sampling_seed or 0,
        vocab_hi=len(tokenizer),
    )
