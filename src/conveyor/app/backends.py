"""What `conveyor backends` reports: every registered training backend, usable here or not, and
the external drivers (trainers that drive our rollouts: VeRL, SkyRL-train)."""

from __future__ import annotations

from collections.abc import Callable

from conveyor.bridges.drivers import EXTERNAL_DRIVERS
from conveyor.registry import BACKENDS
from conveyor.trainer.backend import BackendInfo


def _backend(name: str) -> Callable[[], BackendInfo]:
    return lambda: BACKENDS.spec(name).info()


def backend_infos() -> list[BackendInfo]:
    """`info()` of each backend in `conveyor.registry.BACKENDS` and of each external driver
    (`conveyor.bridges.drivers`), by name.

    One whose module fails to import is listed as unusable with the import error, so one
    broken bridge never hides the others.
    """
    sources = {name: _backend(name) for name in BACKENDS.names()}
    sources.update(EXTERNAL_DRIVERS)
    out: list[BackendInfo] = []
    for name in sorted(sources):
        try:
            info = sources[name]()
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
