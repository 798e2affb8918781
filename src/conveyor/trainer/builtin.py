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
            sync="update_weights: tensors into in-process vllm/hf; safetensors + "
            "reload_weights into a dev-mode vLLM server (engine.kind openai)",
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
        temperature, and a decaying schedule spans `rl.steps`."""
        from conveyor.trainer.engine import TorchTrainingEngine

        temperature = config.sampling.temperature
        return TorchTrainingEngine(
            model_dir,
            settings,
            temperature=temperature if temperature > 0 else 1.0,
            total_steps=max(config.rl.steps, 1) if settings.schedule != "constant" else None,
        )


register_backend("builtin", BuiltinBackend(), exports_model=True, warm_start=True)
