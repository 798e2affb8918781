"""Which runtime kind a task family uses, and building one through `conveyor.registry.RUNTIMES`.

A family describes what a rollout's runtime must hold in a `RuntimeRequest` (an in-memory file
tree, or a host workspace folder with a read-only environment and variables); the builder
registered under the chosen kind turns it into a not yet started `Runtime`. A family lists the
kinds it can use; `choose_runtime` resolves `auto` to the family's default and refuses, when the
family is built (at start), a kind the family cannot use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from conveyor.config.sections import AUTO, RuntimeConfig
from conveyor.registry import RUNTIMES
from conveyor.runtime.base import Runtime
from conveyor.runtime.limits import SandboxLimits
from conveyor.runtime.starts import active_starts, start_gated

R = TypeVar("R", bound=Runtime)


def _no_env(root: str) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class RuntimeRequest:
    """What one rollout's runtime must provide, whichever kind hosts it.

    Exactly one of `files` (an in-memory tree: absolute path -> content, for the simulated
    runtime) and `workspace` (a host folder the runtime works in) is set. `env_at(root)` gives
    the variables commands see once the workspace shows at `root` (which depends on the kind:
    `/workspace` in a sandbox, the host path for the local runtime).
    """

    files: Mapping[str, str] | None = None
    workspace: Path | None = None
    env_dir: Path | None = None
    read_only: Sequence[Path] = ()
    env_at: Callable[[str], dict[str, str]] = _no_env
    limits: SandboxLimits | None = None
    # Host folders the runtime's commands must see empty (only a kind whose spec `hides_paths`).
    hidden: Sequence[Path] = ()
    # The task's own container image (kind `container`); None: the kind's configured image.
    image: str | None = None

    def __post_init__(self) -> None:
        if (self.files is None) == (self.workspace is None):
            raise ValueError("a RuntimeRequest holds either files or a host workspace, not both")

    def host_workspace(self, kind: str) -> Path:
        """The host workspace, or a `ValueError` saying that `kind` needs one."""
        if self.workspace is None:
            raise ValueError(f"runtime kind {kind!r} works in a host workspace folder, not files")
        return self.workspace


class RuntimeBuilder(Protocol):
    """Makes one rollout's runtime (not yet started) from a request and the runtime settings."""

    def __call__(self, request: RuntimeRequest, settings: RuntimeConfig) -> Runtime:
        """A runtime over what `request` describes; `ValueError` if this kind cannot hold it."""
        ...


def choose_runtime(family: str, settings: RuntimeConfig, supported: Sequence[str]) -> str:
    """The runtime kind `family` uses: `settings.kind`, or `supported[0]` for `auto`.

    `ValueError` naming `runtime.kind` and the kinds the family supports when it cannot use the
    kind (so a family refuses it when built, at start, not in the first rollout).
    """
    if not supported:
        raise ValueError(f"task family {family!r} lists no runtime kind it can use")
    kind = supported[0] if settings.kind == AUTO else settings.kind
    if kind not in supported:
        raise ValueError(
            f"task family {family!r} cannot use runtime.kind {kind!r}; it supports "
            f"{', '.join(supported)} (auto = {supported[0]})"
        )
    RUNTIMES.get(kind)  # registered, and its module imports (a missing extra shows here)
    return kind


def build_runtime(kind: str, request: RuntimeRequest, settings: RuntimeConfig) -> Runtime:
    """A not yet started runtime of `kind` (a name `choose_runtime` returned) for `request`."""
    if request.hidden and not RUNTIMES.spec(kind).hides_paths:
        raise ValueError(f"runtime kind {kind!r} cannot hide folders from the code it runs")
    builder: RuntimeBuilder = RUNTIMES.get(kind)
    return builder(request, settings)


async def start_runtime(kind: str, request: RuntimeRequest, settings: RuntimeConfig) -> Runtime:
    """`build_runtime`, started; closed again if it fails to start."""
    return await started(build_runtime(kind, request, settings))


async def started(runtime: R) -> R:
    """`runtime` after `start()`; closed again (nothing leaks) if it fails to start.

    Every runtime start goes through here: inside a run it waits for the run's start limits
    (`conveyor.runtime.starts`, the `RuntimeStarts` the rollout stages make active)."""
    starts = active_starts()
    return await start_gated(runtime, starts.gate if starts is not None else None)
