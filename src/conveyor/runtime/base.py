"""The runtime protocol: a per-rollout environment the tools act on."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

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
