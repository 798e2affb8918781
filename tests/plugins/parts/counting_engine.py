"""An engine added from outside the package: in-process vLLM that counts its requests.

One file plus a registration of a builder in `conveyor.registry.ENGINES`. It subclasses the
built-in engine, so it keeps taking weights (a training run can use it).
"""

from __future__ import annotations

import os
from pathlib import Path

from conveyor.config import ConveyorConfig
from conveyor.engines.base import SampleRequest, SampleResult
from conveyor.engines.factory import vllm_options
from conveyor.engines.vllm_local import VLLMEngine
from conveyor.registry import ENGINES


class CountingVLLMEngine(VLLMEngine):
    """`VLLMEngine` that appends one line per request to `$CONVEYOR_PLUGIN_LOG`."""

    async def sample(self, request: SampleRequest) -> SampleResult:
        """The built-in engine's sample, counted."""
        log = os.environ.get("CONVEYOR_PLUGIN_LOG")
        if log:
            with open(log, "a") as sink:
                sink.write("engine counting request\n")
        return await super().sample(request)


@ENGINES.register("counting_vllm")
def build_counting_engine(config: ConveyorConfig, model_dir: Path) -> CountingVLLMEngine:
    """The `vllm` engine's settings, on the counting subclass."""
    return CountingVLLMEngine(model_dir, **vllm_options(config))
