"""SWE task rows: the SWE-bench format plus our `environment`, loaded from JSONL or parquet.

Our factory writes rows whose `repo` is `pypi:NAME` and whose `version` is the base release, with
`environment` = {`pythonpath`, `test_cmd`, `extra_test_deps`, `setup_patch`} (see docs/swe.md).
Rows of SWE-bench, SWE-Gym, R2E-Gym and SWE-smith load too: `repo` is `owner/name` and
`base_commit` names the commit the task starts from; `environment_setup_commit`, the image
(`image_name`, or `image` as the `swebench` 5 task repos write it) and the harness's
`eval_script`, `log_parser` and `eval_type` are kept when given (other fields in `extra`).
`FAIL_TO_PASS`/`PASS_TO_PASS` may be lists or JSON-encoded lists, as the HF datasets ship them.
A row that is not one of these fails to load with a `ValueError` naming the field.

`to_swebench(row)` writes any row (ours included) as a SWE-bench-format record (the test lists
as JSON strings, an `eval_script` and `log_parser` for the official harness:
`swebench_spec.swebench_record`), so both kinds go through one format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from conveyor.tasks.swe.test_command import parse_test_command

PYPI_PREFIX = "pypi:"
# `owner/name` as GitHub spells it (SWE-bench's `repo`).
_GIT_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
_PYPI_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
EVAL_TYPES = ("pass_and_fail", "fail_only")


class RowEnvironment(BaseModel):
    """How to make and test a `pypi:` task: paths are relative to the unpacked sdist."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pythonpath: str = Field(".", description="Folder put on PYTHONPATH to import the project.")
    test_cmd: str = Field(
        "python -m pytest",
        description="How pytest runs: 'python [-m wrapper ...] -m pytest [flags]'; only "
        "flags that change what pytest prints or switch a plugin off (`row_test_command`).",
    )
    extra_test_deps: list[str] = Field(default_factory=list, description="pip requirements.")
    setup_patch: str = Field("", description="Diff from the sdist to the task's starting state.")

    @field_validator("test_cmd")
    @classmethod
    def _grader_can_run(cls, test_cmd: str) -> str:
        parse_test_command(test_cmd)  # a row the grader would refuse is refused when read
        return test_cmd


class SweRow(BaseModel):
    """One task instance in SWE-bench format (plus `environment` for `pypi:` rows)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    instance_id: str
    repo: str
    version: str = ""
    base_commit: str = ""
    problem_statement: str
    patch: str = ""
    test_patch: str = ""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    environment: RowEnvironment | None = None
    environment_setup_commit: str | None = Field(
        None, description="SWE-bench: the commit the row's environment (image) was built at."
    )
    image_name: str | None = Field(
        None,
        validation_alias=AliasChoices("image_name", "image"),
        description="The row's container image (SWE-Gym/SWE-smith `image_name`, swebench 5 "
        "`image`).",
    )
    eval_script: str | None = Field(
        None,
        description="swebench 5: the harness's bash script; its lines between the start and "
        "end markers are the test command (`swebench_spec.row_test_command`).",
    )
    log_parser: str | None = Field(
        None, description="swebench 5: the name of the harness's log parser for this row."
    )
    eval_type: str | None = Field(
        None, description="swebench 5: pass_and_fail (default) or fail_only."
    )

    @model_validator(mode="before")
    @classmethod
    def _full_test_names(cls, data: Any) -> Any:
        # An exported record (`to_swebench`) whose test names the harness shortens keeps ours.
        if isinstance(data, dict) and isinstance(data.get("conveyor_tests"), dict):
            data = {**data, **data["conveyor_tests"]}
            data.pop("conveyor_tests")
        return data

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else []
            except ValueError as exc:
                raise ValueError(f"not a JSON list of test names ({exc})") from None
        if hasattr(value, "tolist"):
            value = value.tolist()
        return value

    @model_validator(mode="after")
    def _a_task_row(self) -> SweRow:
        if not self.instance_id.strip():
            raise ValueError("instance_id is empty")
        project = self.project
        if project is not None:
            if not _PYPI_NAME.match(project):
                raise ValueError(f"repo {self.repo!r}: 'pypi:' needs a PyPI project name")
            if not self.version:
                raise ValueError(f"repo {self.repo!r}: a pypi: row needs its release (version)")
        else:
            if not _GIT_REPO.match(self.repo):
                raise ValueError(
                    f"repo {self.repo!r}: expected 'owner/name' (a SWE-bench row) or "
                    "'pypi:NAME' (a factory row)"
                )
            if not self.base_commit:
                raise ValueError(f"repo {self.repo!r}: a SWE-bench row needs its base_commit")
            if self.environment is not None:
                raise ValueError("environment is for pypi: rows only (a git row has its image)")
        if not self.FAIL_TO_PASS:
            raise ValueError("FAIL_TO_PASS is empty: nothing would tell a fix from no fix")
        both = set(self.FAIL_TO_PASS) & set(self.PASS_TO_PASS)
        if both:
            raise ValueError(f"tests in both FAIL_TO_PASS and PASS_TO_PASS: {sorted(both)[:3]}")
        if self.eval_type is not None and self.eval_type not in EVAL_TYPES:
            raise ValueError(f"eval_type {self.eval_type!r}: expected one of {EVAL_TYPES}")
        return self

    @field_validator("environment", mode="before")
    @classmethod
    def _decode_environment(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) and value.strip() else value or None

    @property
    def project(self) -> str | None:
        """The PyPI name of a `pypi:` row, else None."""
        return self.repo[len(PYPI_PREFIX) :] if self.repo.startswith(PYPI_PREFIX) else None

    @property
    def env(self) -> RowEnvironment:
        """The row's environment, defaults where it has none."""
        return self.environment or RowEnvironment()

    @property
    def extra(self) -> dict[str, Any]:
        """Fields beyond the SWE-bench core (e.g. `image_name`, `created_at`, `conveyor`)."""
        return dict(self.model_extra or {})

    def to_json(self) -> str:
        """One JSONL line."""
        return json.dumps(self.model_dump(mode="json", exclude_none=True))


def to_swebench(row: SweRow, image: str | None = None) -> dict[str, Any]:
    """`row` as a SWE-bench-format record (`swebench_spec.swebench_record`)."""
    from conveyor.tasks.swe.swebench_spec import swebench_record

    return swebench_record(row, image)


def load_rows(path: Path | str) -> list[SweRow]:
    """Rows from a `.jsonl`/`.json` file, or `.parquet` (needs pyarrow, not a hard dependency)."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(f"reading {path} needs pyarrow (pip install pyarrow)") from exc
        return [SweRow.model_validate(record) for record in pq.read_table(path).to_pylist()]
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        records = json.loads(text)
        return [SweRow.model_validate(r) for r in (records if isinstance(records, list) else [])]
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(SweRow.model_validate_json(line))
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: not a task row: {exc}") from exc
    return rows


def find_row(path: Path | str, instance_id: str) -> SweRow:
    """The row with `instance_id`; `KeyError` naming a few known ids otherwise."""
    rows = load_rows(path)
    for row in rows:
        if row.instance_id == instance_id:
            return row
    some = ", ".join(r.instance_id for r in rows[:5])
    raise KeyError(f"no instance {instance_id!r} in {path} ({len(rows)} rows, e.g. {some})")


def write_rows(path: Path | str, rows: Iterable[SweRow]) -> int:
    """Write rows as JSONL (replacing the file); returns how many."""
    lines = [row.to_json() for row in rows]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)


def prediction(instance_id: str, patch: str, model: str) -> dict[str, str]:
    """One SWE-bench prediction record."""
    return {"instance_id": instance_id, "model_name_or_path": model, "model_patch": patch}


def write_predictions(path: Path | str, predictions: Iterable[dict[str, str]]) -> int:
    """Write SWE-bench `predictions.jsonl` (instance_id, model_name_or_path, model_patch)."""
    lines = [json.dumps(p) for p in predictions]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return len(lines)
