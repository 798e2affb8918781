"""SkyRL's own generator-output validation, read from SkyRL's source, and its TypedDict fields.

SkyRL 0.4.0 needs Python >= 3.12 and its `skyrl.train.utils.trainer_utils` (home of
`validate_generator_output`) imports torch, ray, torchdata and its whole trainer at module level,
none of which install on this CPU machine for 3.12. What the validation itself runs on is
numpy and a logger. So this module takes the function's source text from SkyRL (the installed
package inside `.venv-skyrl`, or the pinned wheel here) and executes that text as is, with only
its module-level imports supplied: the checks that run are SkyRL's, not a re-implementation.

Stdlib and numpy only: the main venv imports it, and `.venv-skyrl`'s Python (which has no
conveyor dependencies) runs it as a script by path:
`python validation.py < batch.json` prints one JSON line of results.
"""

from __future__ import annotations

import ast
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASE_MODULE = "skyrl/train/generators/base.py"
TRAINER_UTILS_MODULE = "skyrl/train/utils/trainer_utils.py"
SAMPLE_SUPPORT_MODULE = "skyrl/backends/skyrl_train/utils/sample_support.py"
# The validation entry point and the helpers it calls, all in TRAINER_UTILS_MODULE.
VALIDATION_FUNCTIONS = (
    "validate_generator_output",
    "_validate_per_token_side_channels",
    "_validate_step_wise_fields",
)


@dataclass(frozen=True)
class SkyrlSource:
    """What this bridge reads from SkyRL's source: the two batch TypedDicts (field -> annotation
    text, in declaration order) and the validation functions' source text."""

    generator_input: dict[str, str]
    generator_output: dict[str, str]
    validation_source: str
    sample_support_field: str


def typed_dict_fields(source: str, name: str) -> dict[str, str]:
    """The annotated fields of class `name` in `source`, as written (annotation text)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {
                item.target.id: ast.unparse(item.annotation)
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
    raise LookupError(f"no class {name} in SkyRL's {BASE_MODULE}")


def function_sources(source: str, names: tuple[str, ...]) -> str:
    """The source text of the module-level functions `names` of `source`, in that order."""
    found = {
        node.name: ast.get_source_segment(source, node)
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name in names
    }
    missing = [n for n in names if not found.get(n)]
    if missing:
        raise LookupError(f"SkyRL's {TRAINER_UTILS_MODULE} has no {', '.join(missing)}")
    return "\n\n".join(str(found[n]) for n in names)


def string_constant(source: str, name: str) -> str:
    """The value of the module-level `name = "..."` in `source`."""
    for node in ast.parse(source).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise LookupError(f"no string constant {name} in SkyRL's {SAMPLE_SUPPORT_MODULE}")


def parse_sources(read: Callable[[str], str]) -> SkyrlSource:
    """Parse SkyRL's modules; `read(path)` gives the text of a path inside the package tree."""
    base = read(BASE_MODULE)
    return SkyrlSource(
        generator_input=typed_dict_fields(base, "GeneratorInput"),
        generator_output=typed_dict_fields(base, "GeneratorOutput"),
        validation_source=function_sources(read(TRAINER_UTILS_MODULE), VALIDATION_FUNCTIONS),
        sample_support_field=string_constant(read(SAMPLE_SUPPORT_MODULE), "SAMPLE_SUPPORT_FIELD"),
    )


def load_validator(parsed: SkyrlSource) -> Callable[..., None]:
    """SkyRL's `validate_generator_output(num_prompts, generator_output, step_wise=False,
    routes_expected=False)`, built from its own source text; it raises AssertionError or
    RuntimeError on an output SkyRL's trainer would refuse."""
    import numpy as np

    # The names its module imports at the top and the function bodies use; annotations stay
    # unevaluated, so the TypedDicts themselves (which import torch) are not needed.
    namespace: dict[str, Any] = {
        "np": np,
        "logger": logging.getLogger("skyrl.validation"),
        "SAMPLE_SUPPORT_FIELD": parsed.sample_support_field,
        "GeneratorOutput": dict,
    }
    code = compile(
        "from __future__ import annotations\n" + parsed.validation_source,
        f"<skyrl {TRAINER_UTILS_MODULE}>",
        "exec",
    )
    exec(code, namespace)
    validator: Callable[..., None] = namespace["validate_generator_output"]
    return validator


@dataclass(frozen=True)
class TrajectoryRef:
    """Stands for SkyRL's `TrajectoryID` dataclass (same fields, same `to_string`), which lives
    in a module that imports torch."""

    instance_id: str
    repetition_id: int

    def to_string(self) -> str:
        """As SkyRL's: `{instance_id}_{repetition_id}`."""
        return f"{self.instance_id}_{self.repetition_id}"


def validate(
    validator: Callable[..., None], num_prompts: int, output: dict[str, Any], step_wise: bool
) -> str:
    """Run SkyRL's validation on `output`; '' when it passes, else its error message."""
    try:
        validator(num_prompts, output, step_wise=step_wise)
    except (AssertionError, RuntimeError, TypeError, IndexError, KeyError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def decode_batch(data: dict[str, Any]) -> dict[str, Any]:
    """A generator output sent as JSON, with its trajectory ids as `TrajectoryRef`s again."""
    out = dict(data)
    if out.get("trajectory_ids") is not None:
        out["trajectory_ids"] = [TrajectoryRef(**ref) for ref in out["trajectory_ids"]]
    return out


def main(argv: list[str]) -> int:
    """`python validation.py < {"batches": [{"name", "num_prompts", "step_wise", "output"}]}`
    with skyrl installed: prints `{"python", "version", "how", "fields", "results": {name:
    error}}`."""
    import importlib.metadata
    import importlib.util
    import platform

    spec = importlib.util.find_spec("skyrl")  # finds the package without importing it
    if spec is None or spec.origin is None:
        print("skyrl is not installed in this Python", file=sys.stderr)
        return 3
    root = Path(spec.origin).parent.parent
    request = json.load(sys.stdin)
    how = "imported"
    try:
        # The real function, when its module's imports (torch, ray, ...) are all installed.
        from skyrl.train.utils.trainer_utils import (  # type: ignore[import-not-found]
            validate_generator_output as validator,
        )
    except ImportError as exc:
        how = f"source of the installed package, executed (import failed: {exc})"
        validator = load_validator(parse_sources(lambda p: (root / p).read_text()))
    parsed = parse_sources(lambda p: (root / p).read_text())
    results = {
        batch["name"]: validate(
            validator, batch["num_prompts"], decode_batch(batch["output"]), batch["step_wise"]
        )
        for batch in request["batches"]
    }
    print(
        json.dumps(
            {
                "python": platform.python_version(),
                "version": importlib.metadata.version("skyrl"),
                "how": how,
                "fields": parsed.generator_output,
                "results": results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
