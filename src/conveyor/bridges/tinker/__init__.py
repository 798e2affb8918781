"""`trainer.backend: tinker` and `engine.kind: tinker`: training and sampling in the Tinker service.

Importing this module registers the `TinkerSpec` backend and the `tinker` engine. The `tinker`
SDK itself (`pip install tinker==0.38.0`) is imported only where it is used, so this module
imports in an environment without it; `conveyor bridge check --backend tinker` then exits 3.
"""

from __future__ import annotations

from conveyor.bridges.tinker.check import check

__all__ = ["check"]
