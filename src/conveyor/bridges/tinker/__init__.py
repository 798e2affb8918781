"""`trainer.backend: tinker` and `engine.kind: tinker`: training and sampling in the Tinker service.

Importing this module registers the `TinkerSpec` backend and the `tinker` engine. The `tinker`
SDK itself (`pip install tinker==0.38.0`) is imported only where it is used, so this module
imports in an environment without it; `conveyor bridge check --backend tinker` then exits 3.
The loss mapping and its limits are in `docs/bridges.md`, "Tinker".
"""

from __future__ import annotations

from conveyor.bridges.tinker.backend import TinkerBackend
from conveyor.bridges.tinker.sampling import TinkerSamplingClient, build_tinker_engine
from conveyor.bridges.tinker.spec import TinkerSpec
from conveyor.bridges.tinker.wire_check import check
from conveyor.registry import ENGINES, EngineSpec
from conveyor.trainer.backend import register_backend

__all__ = ["TinkerBackend", "TinkerSamplingClient", "TinkerSpec", "check"]

register_backend("tinker", TinkerSpec(), sampler="tinker")
ENGINES.add(EngineSpec(name="tinker", build=build_tinker_engine, weight_updates=True))
