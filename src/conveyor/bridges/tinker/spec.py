"""`trainer.backend: tinker`: what `conveyor backends` says of it, what it pairs with, how to
build it."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from conveyor.bridges.tinker.sampling import TinkerSamplingClient, api_key, base_model_name
from conveyor.config import ConveyorConfig, TrainerConfig
from conveyor.engines.base import EngineError
from conveyor.trainer.backend import BackendInfo, BackendUnavailable, TrainingBackend
from conveyor.trainer.policy_losses import ppo_clip_settings

INSTALL = "pip install tinker==0.38.0"


class TinkerSpec:
    """The `BackendMaker` of the Tinker service: LoRA training there, sampling there (it is
    registered with the `tinker` engine as its sampler)."""

    def info(self) -> BackendInfo:
        """Usable where the SDK is installed and `TINKER_API_KEY` is set (the service itself
        is not probed: `info` stays cheap and offline)."""
        try:
            sdk: str | None = version("tinker")
        except PackageNotFoundError:
            sdk = None
        if sdk is None:
            reason = f"the tinker SDK is not installed ({INSTALL})"
        elif not os.environ.get("TINKER_API_KEY"):
            reason = (
                "TINKER_API_KEY is unset: the Tinker service is not reachable from this machine "
                "without it"
            )
        else:
            reason = ""
        return BackendInfo(
            name="tinker",
            version=sdk,
            train=not reason,
            eval=not reason,
            sync="save_weights_for_sampler in the service, then the tinker engine samples "
            "from the saved path (engine.kind tinker)",
            reason=reason,
        )

    def refusal(self, config: ConveyorConfig, engine: Any) -> str | None:
        """Only the `tinker` engine samples from weights saved in the service, and only at
        temperature 1: the service's forward pass, which gives the trainer's logprobs, has no
        temperature, so at any other one the PPO ratio would compare two distributions."""
        if isinstance(engine, TinkerSamplingClient):
            if config.sampling.temperature != 1.0:
                return (
                    f"trainer.backend tinker needs sampling.temperature 1.0 (it is "
                    f"{config.sampling.temperature:g}): the service scores tokens at "
                    "temperature 1, so the ratio against the sampler's logprobs would be biased"
                )
            return None
        return (
            f"trainer.backend tinker needs engine.kind tinker (engine.kind is "
            f"{config.engine.kind!r}): its weights stay in the Tinker service, where only the "
            "tinker engine can sample from them"
        )

    def build(
        self, config: ConveyorConfig, model_dir: Path, settings: TrainerConfig
    ) -> TrainingBackend:
        """A LoRA training client of rank `trainer.lora.r` on the base model the tinker engine
        names (`engine.served_model_name` or `model.path`)."""
        from conveyor.bridges.tinker.backend import TinkerBackend
        from conveyor.bridges.tinker.datums import plan_loss

        # a loss Tinker cannot run is refused before any request
        plan_loss(ppo_clip_settings(settings.loss, "trainer.backend tinker"))
        try:
            import tinker
        except ImportError:
            raise BackendUnavailable(
                f"trainer.backend tinker needs the tinker SDK: {INSTALL}"
            ) from None
        try:
            key = api_key(config)
            base_model = base_model_name(config, model_dir)
        except EngineError as exc:
            raise BackendUnavailable(str(exc)) from None
        try:
            service = tinker.ServiceClient(api_key=key)
            client = service.create_lora_training_client(
                base_model=base_model, rank=settings.lora.r, seed=settings.seed
            ).result()
        except Exception as exc:  # any SDK or connection error: the service is out of reach
            raise BackendUnavailable(
                f"the Tinker service did not give a training client for {base_model!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return TinkerBackend(client, settings)
