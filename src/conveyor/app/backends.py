"""What `conveyor backends` reports: every registered training backend, usable here or not."""

from __future__ import annotations

from conveyor.registry import BACKENDS
from conveyor.trainer.backend import BackendInfo


def backend_infos() -> list[BackendInfo]:
    """`info()` of each backend in `conveyor.registry.BACKENDS`, by name.

    A backend whose module fails to import is listed as unusable with the import error, so one
    broken bridge never hides the others.
    """
    out: list[BackendInfo] = []
    for name in BACKENDS.names():
        try:
            info = BACKENDS.get(name).info()
        except Exception as exc:  # an optional package's import error is a reason, not a crash
            info = BackendInfo(
                name=name,
                version=None,
                train=False,
                eval=False,
                sync="-",
                reason=f"cannot load its bridge: {type(exc).__name__}: {exc}",
            )
        out.append(info)
    return out
