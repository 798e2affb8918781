"""`trainer.backend: builtin`: the PyTorch trainer in this process (`TorchTrainingEngine`).

It syncs by handing its tensors to the engine's `update_weights`, so it pairs with any
`WeightReceiver`: in-process vLLM or transformers, or a vLLM server started in dev mode (the
server engine writes them to safetensors and asks the server to reload).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from conveyor.config import ConveyorConfig, TrainerConfig
from conveyor.engines.base import WeightReceiver
from conveyor.trainer.backend import BackendInfo, TrainingBackend, register_backend


class BuiltinBackend:
    """The `BackendMaker` of the built-in trainer."""

    def info(self) -> BackendInfo:
        """Always usable for training and evaluation where torch is installed."""
        try:
            torch_version: str | None = version("torch")
        except PackageNotFoundError:
            torch_version = None
        return BackendInfo(
            name="builtin",
            version=torch_version,
            train=torch_version is not None,
            eval=True,
            sync="update_weights: tensors into in-process vllm/hf, or broadcast into vLLM "
            "workers through a weight group (engine.weight_sync collective); safetensors + "
            "reload_weights into a dev-mode vLLM server (engine.kind openai) as the fallback",
            reason="" if torch_version else "torch is not installed",
        )

    def refusal(self, config: ConveyorConfig, engine: Any) -> str | None:
        """Engines that cannot take tensors in place and report what they serve are refused."""
        if isinstance(engine, WeightReceiver):
            return None
        return (
            f"engine.kind={config.engine.kind!r} cannot take new weights in place and report "
            "what it serves (update_weights + weight_fingerprint); trainer.backend 'builtin' "
            "needs engine.kind 'vllm', 'hf' or 'openai' against a dev-mode vLLM server (or "
            "rl.steps=0 and rl.warm_start.steps=0: evaluation only)"
        )

    def build(
        self, config: ConveyorConfig, model_dir: Path, settings: TrainerConfig
    ) -> TrainingBackend:
        """`TorchTrainingEngine` on `model_dir`: its logits temperature is the sampling
        temperature, and a decaying schedule spans `rl.steps`. With `trainer.fsdp` and no
        process group in this process, `trainer.fsdp_ranks` local rank processes
        (`conveyor.trainer.local_fsdp`)."""
        from conveyor.trainer.engine import TorchTrainingEngine

        temperature = config.sampling.temperature
        options: dict[str, Any] = {
            "temperature": temperature if temperature > 0 else 1.0,
            "total_steps": max(config.rl.steps, 1) if settings.schedule != "constant" else None,
        }
        if settings.fsdp and not _in_process_group():
            from conveyor.trainer.local_fsdp import LocalFsdpTrainer

            return LocalFsdpTrainer.start(
                model_dir, settings, ranks=_default_ranks(config, settings), **options
            )
        return TorchTrainingEngine(model_dir, settings, **options)


def _default_ranks(config: ConveyorConfig, settings: TrainerConfig) -> int | None:
    """`trainer.fsdp_ranks`, else on CUDA this machine's GPUs less those local vLLM replica
    servers take (the last `replicas x tensor_parallel_size`, as `conveyor plan` places them);
    None leaves the choice (and a CPU trainer's refusal) to `local_fsdp.fsdp_ranks`."""
    if settings.fsdp_ranks is not None or settings.device == "cpu":
        return settings.fsdp_ranks
    import torch

    if not torch.cuda.is_available():
        return None
    engine = config.engine
    local_replicas = (
        engine.kind == "vllm" and engine.replicas > 1 and config.cluster.engine_resource is None
    )
    held = engine.replicas * engine.tensor_parallel_size if local_replicas else 0
    return max(torch.cuda.device_count() - held, 1)


def _in_process_group() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


register_backend("builtin", BuiltinBackend(), exports_model=True, warm_start=True)
