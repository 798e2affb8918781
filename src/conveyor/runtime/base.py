"""The runtime protocol: a per-rollout environment the tools act on."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict


class RuntimeFailure(RuntimeError):
    """The runtime itself failed (sandbox died, could not start): an infrastructure error."""


class ExecResult(BaseModel):
    """Outcome of one command. A command that times out is the policy's doing, not an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False


@runtime_checkable
class Runtime(Protocol):
    """One rollout's environment: started in the init stage, used by tools, closed at the end."""

    async def start(self) -> None:
        """Bring the runtime up. Raises `RuntimeFailure` if it cannot (an infrastructure error)."""
        ...

    async def exec(self, command: str, timeout_s: float) -> ExecResult:
        """Run a shell command; on timeout kill it and return `timed_out=True`."""
        ...

    async def read_file(self, path: str) -> str:
        """Read a text file. Raises `FileNotFoundError`/`IsADirectoryError` for a bad path."""
        ...

    async def write_file(self, path: str, content: str) -> None:
        """Write a text file, creating parent folders."""
        ...

    async def list_dir(self, path: str) -> list[str]:
        """Entries of a folder, folders with a trailing '/'. Raises `FileNotFoundError`."""
        ...

    def alive(self) -> bool:
        """Whether the runtime is started and still usable."""
        ...

    async def close(self) -> None:
        """Release everything the runtime holds; safe to call more than once."""
        ...


R = TypeVar("R", bound=Runtime)


class RuntimeWrapper(Generic[R]):
    """A runtime that runs everything in `inner`, a runtime of the configured kind, and adds
    what a family needs around it (a workspace it owns, a verifier, a code index). Subclasses
    extend `close` to release what they add, after `inner` is closed."""

    def __init__(self, inner: R) -> None:
        self.inner = inner

    @property
    def root(self) -> str:
        """Where commands see the workspace (`/workspace` in a sandbox)."""
        return str(getattr(self.inner, "root", "/workspace"))

    async def start(self) -> None:
        """Start the inner runtime."""
        await self.inner.start()

    async def exec(self, command: str, timeout_s: float) -> ExecResult:
        """Run `command` in the inner runtime."""
        return await self.inner.exec(command, timeout_s)

    async def read_file(self, path: str) -> str:
        """Read a file of the workspace."""
        return await self.inner.read_file(path)

    async def write_file(self, path: str, content: str) -> None:
        """Write a file of the workspace."""
        await self.inner.write_file(path, content)

    async def list_dir(self, path: str) -> list[str]:
        """List a folder of the workspace."""
        return await self.inner.list_dir(path)

    def alive(self) -> bool:
        """Whether the inner runtime is usable."""
        return self.inner.alive()

    async def close(self) -> None:
        """Close the inner runtime."""
        await self.inner.close()
