"""An engine added from outside the package: in-process vLLM that counts its requests.

One file plus a registration of a builder in `conveyor.registry.ENGINES`. It subclasses the
built-in engine, so it keeps taking weights (a training run can use it). Its options
(``engine.options: {tag: ...}``, checked by `CountingOptions` when the config loads) name its
lines in the log.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from conveyor.config import ConveyorConfig
from conveyor.engines.base import SampleRequest, SampleResult
from conveyor.engines.factory import vllm_options
from conveyor.engines.vllm_local import VLLMEngine
from conveyor.registry import ENGINES


class CountingOptions(BaseModel):
    """`engine.options` of `counting_vllm`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    tag: str = Field("counting", min_length=1, description="Its name in the plugin log.")


class CountingVLLMEngine(VLLMEngine):
    """`VLLMEngine` that appends one line per request to `$CONVEYOR_PLUGIN_LOG`."""

    tag = "counting"

    async def sample(self, request: SampleRequest) -> SampleResult:
        """The built-in engine's sample, counted."""
        log = os.environ.get("CONVEYOR_PLUGIN_LOG")
        if log:
            with open(log, "a") as sink:
                sink.write(f"engine {self.tag} request\n")
        return await super().sample(request)


@ENGINES.register("counting_vllm", options=CountingOptions)
def build_counting_engine(config: ConveyorConfig, model_dir: Path) -> CountingVLLMEngine:
    """The `vllm` engine's settings, on the counting subclass tagged by its options."""
    options = config.engine.options
    assert isinstance(options, CountingOptions)
    engine = CountingVLLMEngine(model_dir, **vllm_options(config))
    engine.tag = options.tag
    return engine
