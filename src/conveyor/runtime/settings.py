"""The `runtime` config section: which kind of runtime hosts each rollout, and its knobs.

Torch-free and conveyor-light (it imports only the registry), so the config layer can use it as
a section as is. `kind` names a runtime registered in `conveyor.registry.RUNTIMES` (the built-in
`simulated`, `local`, `bubblewrap`, `docker`, or one a plugin registers) or `auto`, which lets
each task family use its own default. Whether a family can use the kind is checked when the
family is built (`conveyor.runtime.selection.choose_runtime`), i.e. at start.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from conveyor.registry import RUNTIMES

AUTO = "auto"


class RuntimeSettings(BaseModel):
    """Where a rollout's tools act: the runtime kind and what each kind needs."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    kind: str = Field(
        default=AUTO,
        description="Runtime of every rollout: 'auto' (each task family's default: simulated "
        "for arithmetic and filenav, bubblewrap for swe) or a registered runtime kind "
        "(simulated, local, bubblewrap, docker, or a plugin's). A family refuses at start a "
        "kind it cannot use.",
    )
    docker_image: str | None = Field(
        default=None,
        description="Image of the docker runtime's containers (needed when kind is 'docker'); "
        "the task's workspace is mounted at /workspace in it.",
    )
    workspace_size_bytes: int | None = Field(
        default=None,
        gt=0,
        description="A disk of its own per SWE rollout workspace: a tmpfs of this size holds "
        "what the rollout writes, so filling it fills no one else's disk (needs root); None: "
        "the workspaces share the host disk.",
    )

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        return kind if kind == AUTO else RUNTIMES.check(kind)

    @model_validator(mode="after")
    def _docker_has_an_image(self) -> RuntimeSettings:
        if self.kind == "docker" and not self.docker_image:
            raise ValueError("runtime.kind 'docker' needs runtime.docker_image (the image to run)")
        return self
