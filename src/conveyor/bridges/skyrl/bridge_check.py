"""`conveyor bridge check --backend skyrl`: our trajectories as SkyRL's `GeneratorOutput`,
validated by SkyRL's own `validate_generator_output`.

Inside `.venv-skyrl` (Python >= 3.12 with skyrl installed; `scripts/venv-skyrl.sh`) the
validation runs there, in a subprocess. Elsewhere (this machine has Python 3.11, and SkyRL 0.4.0
requires 3.12) it runs here on the source read from the pinned wheel; the report then says
version "0.4.0 (wheel, parsed)" and python "3.11 (fallback)". Either way the keys and value types
of our output are checked against the `GeneratorOutput` fields SkyRL declares, and the rows
against our own samples.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conveyor.bridges.report import BridgeUnavailable, CheckReport
from conveyor.bridges.skyrl.generator import WRITTEN_KEYS, to_generator_output
from conveyor.bridges.skyrl.validation import load_validator, validate
from conveyor.bridges.skyrl.wheel import SKYRL_VERSION, parse_wheel, pinned_wheel
from conveyor.types import Status, TrainingSample, Trajectory

VALIDATION_SCRIPT = Path(__file__).with_name("validation.py")
REPO_ROOT = Path(__file__).resolve().parents[4]


def skyrl_python() -> Path | None:
    """`.venv-skyrl`'s interpreter (`CONVEYOR_SKYRL_VENV`, else the repository's
    `.venv-skyrl`), when it exists."""
    venv = Path(os.environ.get("CONVEYOR_SKYRL_VENV", REPO_ROOT / ".venv-skyrl"))
    python = venv / "bin" / "python"
    return python if python.exists() else None


def load_trajectories(path: Path) -> list[Trajectory]:
    """Every trajectory of a JSONL file (blank lines skipped)."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [Trajectory.model_validate_json(line) for line in lines]


def check(trajectories: Path) -> CheckReport:
    """Check SkyRL's reading of the trajectories' samples (`conveyor.bridges.report`)."""
    rollouts = load_trajectories(trajectories)
    batches = {
        "rollout": to_generator_output(rollouts, step_wise=False),
        "step_wise": to_generator_output(rollouts, step_wise=True),
    }
    python = skyrl_python()
    if python is not None:
        report, fields, results = _check_in_venv(python, batches, len(rollouts))
    else:
        wheel = pinned_wheel()
        parsed = parse_wheel(wheel)
        report = CheckReport(
            backend="skyrl",
            version=f"{SKYRL_VERSION} (wheel, parsed)",
            samples=0,
            python=f"{platform.python_version()} (fallback)",
        )
        validator = load_validator(parsed)
        fields = parsed.generator_output
        results = {
            name: validate(validator, len(rollouts), output, name == "step_wise")
            for name, output in batches.items()
        }
        report.add(
            "validation source",
            True,
            f"validate_generator_output and helpers from {wheel.name}, executed here",
        )
    report.samples = sum(len(t.samples()) for t in rollouts)
    for name, error in results.items():
        report.add(
            f"skyrl validate_generator_output ({name})",
            not error,
            error or f"{len(batches[name]['response_ids'])} rows pass",
        )
    for name, output in batches.items():
        add_field_checks(report, name, output, fields)
    add_sample_checks(report, rollouts, batches)
    return report


def _check_in_venv(
    python: Path, batches: dict[str, dict[str, Any]], num_prompts: int
) -> tuple[CheckReport, dict[str, str], dict[str, str]]:
    request = {
        "batches": [
            {
                "name": name,
                "num_prompts": num_prompts,
                "step_wise": name == "step_wise",
                "output": _jsonable(output),
            }
            for name, output in batches.items()
        ]
    }
    done = subprocess.run(
        [str(python), str(VALIDATION_SCRIPT)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise BridgeUnavailable(
            f"{python} could not run SkyRL's validation: {done.stderr.strip()[-800:]}"
        )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    report = CheckReport(
        backend="skyrl", version=answer["version"], samples=0, python=answer["python"]
    )
    report.add("validation source", True, f"{answer['how']} in {python.parent.parent}")
    return report, answer["fields"], answer["results"]


def _jsonable(output: dict[str, Any]) -> dict[str, Any]:
    out = dict(output)
    if out.get("trajectory_ids") is not None:
        out["trajectory_ids"] = [
            {"instance_id": r.instance_id, "repetition_id": r.repetition_id}
            for r in out["trajectory_ids"]
        ]
    return out


def add_field_checks(
    report: CheckReport, name: str, output: dict[str, Any], fields: dict[str, str]
) -> None:
    """Our keys vs SkyRL's declared fields, and every value vs its field's annotation."""
    unknown = sorted(set(output) - set(fields))
    required = [k for k, a in fields.items() if not a.startswith("Optional[")]
    missing = sorted(set(required) - set(output))
    report.add(
        f"keys are GeneratorOutput fields ({name})",
        not unknown and not missing,
        f"unknown {unknown}, required but missing {missing}"
        if unknown or missing
        else f"{len(output)} keys, all {len(required)} required ones present",
    )
    wrong = [
        f"{key}: {fields[key]}"
        for key, value in output.items()
        if key in fields and not matches(value, ast.parse(fields[key], mode="eval").body)
    ]
    report.add(
        f"values match GeneratorOutput annotations ({name})",
        not wrong,
        "; ".join(wrong) if wrong else "every value has its declared type",
    )


def matches(value: Any, annotation: ast.expr) -> bool:
    """Whether `value` has the type an annotation of SkyRL's TypedDicts spells (List, Dict,
    Optional, Union, builtins, Any, TrajectoryID; an unknown name never matches)."""
    if isinstance(annotation, ast.Name):
        simple: dict[str, Any] = {
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "float": lambda v: isinstance(v, float | int) and not isinstance(v, bool),
            "str": lambda v: isinstance(v, str),
            "bool": lambda v: isinstance(v, bool),
            "Any": lambda v: True,
            "TrajectoryID": lambda v: hasattr(v, "instance_id") and hasattr(v, "repetition_id"),
        }
        test = simple.get(annotation.id)
        return bool(test and test(value))
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name):
        head = annotation.value.id
        args: Sequence[ast.expr] = (
            annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        )
        if head == "Optional":
            return value is None or matches(value, args[0])
        if head == "Union":
            return any(matches(value, arg) for arg in args)
        if head == "List":
            return isinstance(value, list) and all(matches(v, args[0]) for v in value)
        if head == "Dict":
            return isinstance(value, dict) and all(
                matches(k, args[0]) and matches(v, args[1]) for k, v in value.items()
            )
    return False


def add_sample_checks(
    report: CheckReport, rollouts: Sequence[Trajectory], batches: dict[str, dict[str, Any]]
) -> None:
    """The rows are our samples, token for token: prompt + response ids, loss masks and
    logprobs; one row per rollout, or per sample in step-wise mode."""
    needed = ("prompt_token_ids", "response_ids", "loss_masks", "rollout_logprobs")
    for name, output in batches.items():
        absent = [key for key in needed if not isinstance(output.get(key), list)]
        if absent:
            report.add(f"rows equal our samples ({name})", False, f"no {', '.join(absent)}")
            continue
        expected: list[tuple[TrainingSample | None, bool]] = []
        for trajectory in rollouts:
            broken = trajectory.status is Status.INFRA_ERROR
            samples: list[TrainingSample | None] = list(trajectory.samples()) or [None]
            expected.extend((s, broken) for s in (samples if name == "step_wise" else samples[:1]))
        bad = []
        if len(expected) != len(output["response_ids"]):
            bad.append(f"{len(output['response_ids'])} rows for {len(expected)} samples")
        for i, (sample, broken) in enumerate(expected[: len(output["response_ids"])]):
            if sample is None:
                continue
            cut = sample.prompt_length
            mask = [0] * (len(sample.input_ids) - cut) if broken else sample.loss_mask[cut:]
            if (
                output["prompt_token_ids"][i] + output["response_ids"][i] != sample.input_ids
                or len(output["prompt_token_ids"][i]) != cut
                or output["rollout_logprobs"][i] != sample.logprobs[cut:]
                or output["loss_masks"][i] != mask
            ):
                bad.append(f"row {i}")
        report.add(
            f"rows equal our samples ({name})",
            not bad,
            ", ".join(bad[:5]) if bad else f"{len(expected)} rows: ids, masks, logprobs equal",
        )
    written = set(WRITTEN_KEYS)
    report.add(
        "written keys",
        all(set(o) == written for o in batches.values()),
        ", ".join(sorted(written)),
    )
