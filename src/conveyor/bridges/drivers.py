"""External drivers: trainers that drive our rollouts rather than being driven by our loop.

VeRL and SkyRL-train own the training loop and call into conveyor for rollouts, so they are no
`trainer.backend` (a backend is something `conveyor train` builds and steps). `conveyor
backends` still lists them beside the backends, with their versions and how to run them;
naming one as `trainer.backend` is refused with that pointer (`conveyor.registry.BACKENDS`).
"""

from __future__ import annotations

from collections.abc import Callable

from conveyor.trainer.backend import BackendInfo


def _verl() -> BackendInfo:
    from conveyor.bridges.verl import VerlSpec

    return VerlSpec().info()


def _skyrl() -> BackendInfo:
    from conveyor.bridges.skyrl import SkyrlSpec

    return SkyrlSpec().info()


# name -> what `conveyor backends` says of it (its bridge is imported only when asked).
EXTERNAL_DRIVERS: dict[str, Callable[[], BackendInfo]] = {"verl": _verl, "skyrl": _skyrl}
