"""`tasks.options.swe`: which rows a run uses and how they are graded, checked when the config
loads and recorded in the run's `config.yaml`.

- `rows`: row files (JSONL, JSON or parquet), each a path or the name of a task set,
  `<swe_home>/tasks/<name>.jsonl` (what `conveyor tasks build --out` writes there). The config
  records each as `{path: <absolute path>, sha256: <its content hash>}`, so a run says exactly
  which rows it used; a recorded hash that no longer matches the file is refused (the rows
  changed since). Left out, the rows come from `$CONVEYOR_SWE_TASKS` (`:`-separated files) or
  every `<swe_home>/tasks/*.jsonl`, as before, and those files are what the config records.
- `grading`: `GradingOptions` (semantics, per-test and whole-run timeouts, the grading runtime,
  partial credit, memory); the family's reward budget follows `grading.run_timeout_s`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from conveyor.config.sections import AUTO, RuntimeConfig
from conveyor.registry import RUNTIMES
from conveyor.tasks.swe.environment import swe_home
from conveyor.tasks.swe.test_run import Semantics

TASKS_ENV = "CONVEYOR_SWE_TASKS"
ROW_SUFFIXES = (".jsonl", ".json", ".parquet")
_TASK_SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def task_set_path(name: str) -> Path:
    """Where the task set `name` lives: `<swe_home>/tasks/<name>.jsonl`."""
    return swe_home() / "tasks" / f"{name}.jsonl"


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _is_task_set_name(entry: str) -> bool:
    return bool(_TASK_SET_NAME.fullmatch(entry)) and not entry.endswith(ROW_SUFFIXES)


class RowsFile(BaseModel):
    """One row file of a run: its absolute path and the SHA-256 of its content.

    Written in a config as a path (absolute, `~/...` or relative to the working folder), a task
    set name, or `{path, sha256}` (what a run records; the hash must still match)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    sha256: str

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, entry: Any) -> Any:
        if isinstance(entry, str):
            entry = {"path": entry}
        if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), str):
            return entry  # the field checks report what is wrong
        given = str(entry["path"])
        if _is_task_set_name(given):
            path = task_set_path(given)
            if not path.is_file():
                raise ValueError(
                    f"no task set {given!r}: {path} does not exist (a name means "
                    "<swe_home>/tasks/<name>.jsonl; give a path for any other file)"
                )
        else:
            path = Path(given).expanduser().resolve()
            if not path.is_file():
                where = "" if str(path) == given else f" ({path})"
                raise ValueError(f"rows file {given!r} does not exist{where}")
        now = file_sha256(path)
        recorded = entry.get("sha256")
        if recorded is not None and recorded != now:
            raise ValueError(
                f"rows file {path} changed since this config recorded it (sha256 "
                f"{str(recorded)[:12]}... then, {now[:12]}... now); drop its sha256 to use the "
                "file as it is now"
            )
        return {**entry, "path": str(path), "sha256": now}

    def check_unchanged(self) -> Path:
        """The file's path; `ValueError` if its content is no longer what was recorded."""
        path = Path(self.path)
        if file_sha256(path) != self.sha256:
            raise ValueError(
                f"tasks.options.swe.rows: {path} changed after the config was loaded (its "
                "sha256 no longer matches the recorded one)"
            )
        return path


# `GradingOptions` lives here, not in `grading.py`, because the canaries (which the grader runs)
# take it too: defined in the grader, it would tie the two modules into a type-level loop.
GradingRuntime = Literal["auto", "bubblewrap", "local", "container"]


class GradingOptions(BaseModel):
    """How tests are run for grading (`tasks.options.swe.grading`, `conveyor tasks grade --set`).

    The grader's tests run in bubblewrap (`runtime` `auto` or `bubblewrap`), or in the row's
    own container image (`container`, which `auto` becomes under `runtime.kind: container`); a
    sandbox that cannot start is an infrastructure error, never a reason to run without it. `local`
    runs them unsandboxed on this host, where the policy's code could rewrite its own verdict:
    only with `unsandboxed_grading_i_trust_the_policy: true`, and said in a warning at start.
    """

    model_config = ConfigDict(extra="forbid")

    per_test_timeout_s: float = Field(30.0, gt=0, description="Per test (setup+call+teardown).")
    run_timeout_s: float = Field(900.0, gt=0, description="Whole pytest run.")
    partial_credit: bool = Field(False, description="Reward the share of F2P passing.")
    runtime: GradingRuntime = Field(
        "auto",
        description="auto (= bubblewrap; = container under runtime.kind container) | "
        "bubblewrap | container (the row's own image, on runtime.engine) | local (needs the "
        "key below)",
    )
    unsandboxed_grading_i_trust_the_policy: bool = Field(
        False, description="Allow runtime 'local': the graded tests run without a sandbox."
    )
    memory_bytes: int = Field(4 << 30, gt=0, description="Address space per process.")
    semantics: Semantics = Field(
        "strict",
        description="strict: only a real pass counts (for rewards); swebench: xfailed counts "
        "as passing too, as in SWE-bench's report.",
    )
    canaries: int = Field(
        2, ge=0, description="Hidden canary tests per row (`swe.canaries`); 0 runs none."
    )

    # The run's runtime settings (engine, runtime.image) for runtime 'container'; set by the
    # family or `conveyor tasks grade`, never read from the options' own keys.
    _container: RuntimeConfig | None = PrivateAttr(None)

    def in_containers(self, settings: RuntimeConfig) -> GradingOptions:
        """These options grading in the rows' containers on `settings`' engine and images."""
        moved = self.model_copy(update={"runtime": "container"})
        moved._container = settings
        return moved

    @property
    def container_settings(self) -> RuntimeConfig:
        """The runtime settings runtime 'container' grades with (the defaults if none)."""
        return self._container if self._container is not None else RuntimeConfig()

    @model_validator(mode="after")
    def _unsandboxed_only_when_meant(self) -> Self:
        trusted = self.unsandboxed_grading_i_trust_the_policy
        if self.unsandboxed and not trusted:
            raise ValueError(
                "runtime 'local' grades without a sandbox (the tests run the policy's code on "
                "this host, where it can rewrite its own verdict); set "
                "unsandboxed_grading_i_trust_the_policy: true to allow it"
            )
        if trusted and not self.unsandboxed:
            raise ValueError(
                "unsandboxed_grading_i_trust_the_policy: true does nothing unless runtime is "
                f"'local' (runtime {self.runtime!r} grades in a sandbox); remove it"
            )
        return self

    @property
    def unsandboxed(self) -> bool:
        """Whether the graded tests run without a sandbox (`runtime: local`: a kind whose
        spec is `unsandboxed`)."""
        return self.runtime != AUTO and RUNTIMES.spec(self.runtime).unsandboxed


class SweOptions(BaseModel):
    """`tasks.options.swe` (see the module doc)."""

    model_config = ConfigDict(extra="forbid")

    rows: list[RowsFile] | None = Field(
        None,
        description="Row files (paths or task set names); null: $CONVEYOR_SWE_TASKS or "
        "<swe_home>/tasks/*.jsonl.",
    )
    grading: GradingOptions = Field(default_factory=GradingOptions)

    @field_validator("rows", mode="before")
    @classmethod
    def _one_or_many(cls, rows: Any) -> Any:
        return [rows] if isinstance(rows, str) else rows


def default_row_files() -> list[Path]:
    """The row files when `tasks.options.swe.rows` is not set: `$CONVEYOR_SWE_TASKS`
    (`:`-separated), else every `*.jsonl` under `<swe_home>/tasks`."""
    configured = os.environ.get(TASKS_ENV)
    if configured:
        return [Path(p).expanduser() for p in configured.split(":") if p]
    return sorted((swe_home() / "tasks").glob("*.jsonl"))


def resolve_swe_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` as a run uses and records them: every key with its value, the rows as absolute
    paths with their content hashes (taken from `$CONVEYOR_SWE_TASKS` or the task cache when not
    set). `ValueError` naming `tasks.options.swe` and the bad keys."""
    from conveyor.tasks.family import family_options

    checked = family_options("swe", SweOptions, options)
    if checked.rows is None:
        files = [str(path.resolve()) for path in default_row_files()]
        where = f"${TASKS_ENV}" if os.environ.get(TASKS_ENV) else "the task cache"
        try:
            rows = [RowsFile.model_validate(path) for path in files]
        except ValidationError as error:
            why = "; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())
            raise ValueError(f"tasks.options.swe.rows (from {where}): {why}") from None
        checked = checked.model_copy(update={"rows": rows})
    return checked.model_dump(mode="json")
