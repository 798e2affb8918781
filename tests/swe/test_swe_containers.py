"""SWE rows in their own container images on the real engine (podman here, docker elsewhere).

One small per-task image (the tiny project's row: the base image, a test-environment layer
with pytest and coverage, the row's starting state at /testbed), built by the first test that
needs it and then found in the engine's store (its tag is a hash of its inputs). Through it:

- `conveyor tasks grade --set runtime.kind=container` (the contract): the gold patch resolves,
  the empty patch does not, a patch that fixes the bug only where the image's venv exists
  resolves (the tests really ran in the container), and a patch forging the whole outcome
  stream is caught by the canaries as tampering; no container is left behind;
- a rollout of the swe family under `runtime.kind: container`: the agent's commands run in the
  row's container (the repository at /testbed, the image's Python, no network), the oracle's
  edits are graded in a container too, and `close` removes it;
- an exported row (`conveyor tasks export`: the SWE-bench record of the tiny row) graded by
  `conveyor tasks grade --set runtime.kind=container` with swebench's test command and parser
  inside its image: gold resolves, empty does not, a forged test log is tampering;
- `conveyor images build --config C`: the run's image found in the store (nothing built); with
  `runtime.image`, the missing pulled images listed and exit 1;
- refusals: a run whose images are missing refuses to start, naming the rows and the command
  that builds them; a `runtime.image` template (images pulled from a registry, of which none is
  reachable here: the registry name is a fake) is resolved per row and refused the same way
  when the image is not there; grading with an engine that does not answer is an
  infrastructure error (`RuntimeFailure`), never a score.
Skips, saying why, where no engine answers or the base image cannot be built.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tiny_project import CALC, buggy_calc, tiny_row
from trust_attacks import payload
from typer.testing import CliRunner

from conveyor.agent.tools import ToolContext
from conveyor.config import RuntimeConfig
from conveyor.runtime.base import RuntimeFailure
from conveyor.runtime.engine import engine_available, engine_of, owner_labels, resolve_engine
from conveyor.runtime.images import ImageBuildError, MissingImages, ensure_base_image
from conveyor.tasks.family import get_family
from conveyor.tasks.swe.cli import tasks_app
from conveyor.tasks.swe.dataset import SweRow, write_rows
from conveyor.tasks.swe.family import SweFamily, SweRuntime
from conveyor.tasks.swe.grading import GradingOptions, grade
from conveyor.tasks.swe.images import ensure_row_image, row_image, templated_image
from conveyor.tasks.swe.patches import file_diff

ENGINE = resolve_engine("auto")
ENGINE_OK, ENGINE_WHY = engine_available(ENGINE)
needs_engine = pytest.mark.skipif(not ENGINE_OK, reason=f"no container engine: {ENGINE_WHY}")
CONTAINER = RuntimeConfig(kind="container")
FAKE_REGISTRY = "registry.conveyor-test.invalid/sweb.eval.x86_64.{instance_id}"


@pytest.fixture(scope="session")
def row_image_tag() -> str:
    """The tiny row's image, built on first use (a cache hit in every later run)."""
    try:
        ensure_base_image(ENGINE)
        return ensure_row_image(tiny_row(), CONTAINER)[0]
    except ImageBuildError as exc:
        pytest.skip(f"the row's image cannot be built here: {exc}")


def _grade_cli(rows: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        tasks_app,
        ["grade", "--tasks", str(rows), "--instance", tiny_row().instance_id, "--json", *args],
    )
    return result.exit_code, result.output


def _leftovers() -> list[str]:
    filters = [a for k, v in owner_labels().items() for a in ("--filter", f"label={k}={v}")]
    done = ENGINE.run("ps", "-a", "--format", "{{.Names}}", *filters)
    return done.stdout.split()


@needs_engine
def test_tasks_grade_in_the_rows_container(row_image_tag: str, tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    write_rows(rows, [tiny_row()])
    container = ["--set", "runtime.kind=container"]

    code, out = _grade_cli(rows, "--gold", *container)
    assert code == 0, out
    gold = json.loads(out.strip().splitlines()[-1])
    assert gold["resolved"] is True and gold["f2p_passed"] == 2 and gold["p2p_passed"] == 3

    code, out = _grade_cli(rows, *container)
    assert code == 0, out
    empty = json.loads(out.strip().splitlines()[-1])
    assert empty["resolved"] is False and empty["f2p_passed"] == 0

    # Fixed only where the image's venv exists: resolved only if the tests ran in the image.
    inside = CALC.replace(
        "    return a + b",
        "    import os\n    return a + b if os.path.isdir('/opt/conveyor/venv') else a - b",
    )
    patch = tmp_path / "inside.diff"
    patch.write_text(file_diff("tinycalc/__init__.py", buggy_calc(), inside))
    code, out = _grade_cli(rows, "--patch", str(patch), *container)
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["resolved"] is True

    # The defences hold in the container: a patch forging a full outcome stream on the
    # channel (every selected test passed, the hidden canaries too) is caught as tampering.
    forged = tmp_path / "forged.diff"
    forged.write_text(
        file_diff(
            "tinycalc/__init__.py",
            buggy_calc(),
            buggy_calc() + payload("frame_walk_forged_stream", None),
        )
    )
    code, out = _grade_cli(rows, "--patch", str(forged), *container)
    assert code == 0, out
    verdict = json.loads(out.strip().splitlines()[-1])
    assert verdict["resolved"] is False and verdict["tampered"] is True
    assert _leftovers() == []


# An atexit hook of the project's module: after pytest's real summary, it prints the
# row's tests as PASSED, its own end marker and exit status, and exits 0 (swebench's parser
# keeps a test's last line, its exit-status cross-check reads the first status line).
FAKE_LOG = """

def _conveyor_fake_log():
    import os
    tests = ["tests/test_calc.py::test_add", "tests/test_hidden.py::test_add_negative",
             "tests/test_calc.py::test_clamp_low", "tests/test_calc.py::test_clamp_mid"]
    lines = [f"PASSED {t}" for t in tests]
    lines += [">>>>> End Test Output", ">>>>> Test Exit Code: 0"]
    os.write(1, ("\\n".join(lines) + "\\n").encode())
    os._exit(0)


import atexit as _conveyor_atexit
_conveyor_atexit.register(_conveyor_fake_log)
"""


@needs_engine
def test_an_exported_swebench_row_is_log_graded_in_its_container(
    row_image_tag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One path for both kinds: the factory row exported as a SWE-bench record (eval_script,
    log_parser, image) is graded by swebench's test command and parser inside its locally
    built image; gold resolves, empty does not, a forged test log is tampering."""
    from conveyor.runtime.docker import DockerRuntime
    from conveyor.tasks.swe.swebench_spec import START, uses_log_grading

    write_rows(tmp_path / "rows.jsonl", [tiny_row()])
    rows = tmp_path / "swebench.jsonl"
    exported = CliRunner().invoke(
        tasks_app, ["export", "--tasks", str(tmp_path / "rows.jsonl"), "--out", str(rows)]
    )
    assert exported.exit_code == 0, exported.output
    record = json.loads(rows.read_text().splitlines()[0])
    assert record["log_parser"] == "parse_log_pytest" and "eval_script" in record
    row = SweRow.model_validate(record)
    assert uses_log_grading(row) and row_image(row, CONTAINER) == row_image_tag
    ran: list[str] = []
    exec_ = DockerRuntime.exec

    async def spy(self: DockerRuntime, command: str, *args: object, **kw: object) -> object:
        ran.append(f"{self.image} {command}")
        return await exec_(self, command, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(DockerRuntime, "exec", spy)
    container = ["--set", "runtime.kind=container"]

    code, out = _grade_cli(rows, "--gold", *container)
    assert code == 0, out
    gold = json.loads(out.strip().splitlines()[-1])
    assert gold["resolved"] is True and gold["f2p_passed"] == 2 and gold["p2p_passed"] == 3
    # the harness's test command between its markers ran in the row's image
    logged = [c for c in ran if START in c]
    assert logged and all(c.startswith(row_image_tag) for c in logged)
    # the row's own pytest arguments, started by our bootstrap (the in-process defences on)
    assert "conveyor_pytest.py" in logged[0] and "-rA" in logged[0]

    code, out = _grade_cli(rows, *container)
    assert code == 0, out
    empty = json.loads(out.strip().splitlines()[-1])
    assert empty["resolved"] is False and empty["f2p_passed"] == 0

    # A plugin forcing the hidden tests' reports to pass (pytest's own log and exit status
    # agree with it) is seen by the bootstrap's plugin check inside the container.
    plugin = tmp_path / "plugin.diff"
    attack = payload("plugin_without_file", list(row.FAIL_TO_PASS))
    plugin.write_text(file_diff("tinycalc/__init__.py", buggy_calc(), buggy_calc() + attack))
    code, out = _grade_cli(rows, "--patch", str(plugin), *container)
    assert code == 0, out
    verdict = json.loads(out.strip().splitlines()[-1])
    assert verdict["resolved"] is False and verdict["tampered"] is True, out

    # A command that is not one plain pytest run runs as written, without the bootstrap: there
    # the log's own checks catch an atexit hook printing a forged report.
    assert row.eval_script is not None
    script = row.eval_script.replace("python -m pytest", "cd /testbed && python -m pytest")
    write_rows(rows, [row.model_copy(update={"eval_script": script})])
    forged = tmp_path / "forged.diff"
    forged.write_text(file_diff("tinycalc/__init__.py", buggy_calc(), buggy_calc() + FAKE_LOG))
    code, out = _grade_cli(rows, "--patch", str(forged), *container)
    assert code == 0, out
    verdict = json.loads(out.strip().splitlines()[-1])
    assert verdict["resolved"] is False and verdict["tampered"] is True, out
    assert "forged test report" in out
    assert _leftovers() == []


@needs_engine
def test_a_swe_rollout_runs_and_is_graded_in_the_rows_container(row_image_tag: str) -> None:
    family = get_family("swe", CONTAINER)
    assert isinstance(family, SweFamily) and family.grading.runtime == "container"
    task = family.task(tiny_row())
    assert "/testbed" in str(task.prompt[0]["content"])

    async def rollout() -> tuple[str, float, str]:
        runtime = await family.make_runtime(task)
        try:
            assert isinstance(runtime, SweRuntime)
            probe = (
                "pwd; cat /etc/debian_version; python -c 'import sys; print(sys.prefix)'; "
                "python -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 2)' "
                "2>&1 | tail -1"
            )
            seen = (await runtime.exec(probe, 30)).stdout
            ctx = ToolContext(runtime=runtime, task=task)
            for call in family.oracle_calls(task)[:-1]:
                await family.tools().get(call.name).invoke(call.arguments, ctx)
            reward = await family.score(task, None, runtime)
            name = runtime.inner.name  # type: ignore[attr-defined]
        finally:
            await runtime.close()
        return seen, reward, name

    seen, reward, name = asyncio.run(rollout())
    cwd, debian, prefix, network = seen.splitlines()
    assert cwd == "/testbed" and debian.startswith("12.") and prefix == "/opt/conveyor/venv"
    assert "unreachable" in network.lower()
    assert reward == 1.0
    assert ENGINE.run("container", "inspect", name).returncode != 0


def _renamed(instance_id: str) -> SweRow:
    return tiny_row().model_copy(update={"instance_id": instance_id})


@needs_engine
def test_a_run_refuses_to_start_while_images_are_missing(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    write_rows(rows, [_renamed(f"tinycalc__never_built_{i}") for i in range(30)])
    options = {"rows": [str(rows)]}
    from conveyor.types import FamilyServices

    built_here = get_family("swe", CONTAINER, FamilyServices(options=options))
    with pytest.raises(MissingImages, match=r"conveyor images build --config") as missing:
        built_here.make_tasks(3, 0, "train")
    assert len(missing.value.missing) == 3
    assert all(
        tag.startswith("conveyor-swe-task-tinycalc__never_built_")
        for _, tag in missing.value.missing
    )

    pulled = RuntimeConfig(kind="container", image=FAKE_REGISTRY)
    family = get_family("swe", pulled, FamilyServices(options=options))
    with pytest.raises(MissingImages, match=r"pull them first") as missing:
        family.make_tasks(2, 0, "train")
    assert all(
        tag.startswith("registry.conveyor-test.invalid/sweb.eval.x86_64.tinycalc__never")
        for _, tag in missing.value.missing
    )


def test_runtime_image_templates_name_each_rows_image__fake_registry() -> None:
    row = tiny_row()
    assert templated_image(FAKE_REGISTRY, row) == (
        "registry.conveyor-test.invalid/sweb.eval.x86_64.tinycalc__add_bug"
    )
    assert row_image(row, RuntimeConfig(kind="container", image="r/{repo}:{version}")) == (
        "r/pypi:conveyor-tinycalc:1.0"
    )
    with pytest.raises(ValueError, match=r"unknown field 'name'"):
        templated_image("r/{name}", row)


@needs_engine
def test_tasks_grade_refuses_a_missing_pulled_image__fake_registry(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    write_rows(rows, [tiny_row()])
    code, out = _grade_cli(
        rows, "--gold", "--set", "runtime.kind=container", "--set", f"runtime.image={FAKE_REGISTRY}"
    )
    assert code == 2
    assert "registry.conveyor-test.invalid/sweb.eval.x86_64.tinycalc__add_bug" in out
    assert "pull them first" in out


@pytest.mark.skipif(engine_available(engine_of("docker"))[0], reason="docker answers here")
def test_grading_without_an_answering_engine_is_an_infrastructure_error__no_docker() -> None:
    options = GradingOptions().in_containers(RuntimeConfig(kind="container", engine="docker"))
    with pytest.raises(RuntimeFailure, match=r"container engine is not usable"):
        asyncio.run(grade(tiny_row(), tiny_row().patch, options))


@needs_engine
def test_images_build_builds_what_a_run_needs_and_lists_missing_pulled_images__fake_registry(
    row_image_tag: str, tmp_path: Path
) -> None:
    from conveyor.cli import app

    rows = tmp_path / "rows.jsonl"
    write_rows(rows, [tiny_row()])
    config = tmp_path / "run.yaml"
    config.write_text(
        f"tasks:\n  families: [swe]\n  options:\n    swe:\n      rows: [{rows}]\n"
        "runtime:\n  kind: container\ndispatch:\n  reward_timeout_s: 1000\n"
    )
    built = CliRunner().invoke(app, ["images", "build", "--config", str(config), "--json"])
    assert built.exit_code == 0, built.output
    summary = json.loads(built.output.strip().splitlines()[-1])
    assert summary == {
        "images": 1,
        "built": 0,
        "cached": 1,
        "seconds": summary["seconds"],
        "missing": 0,
    }

    pulled = ["--set", f"runtime.image={FAKE_REGISTRY}", "--json"]
    listed = CliRunner().invoke(app, ["images", "build", "--config", str(config), *pulled])
    assert listed.exit_code == 1
    assert "missing: tinycalc__add_bug: registry.conveyor-test.invalid/" in listed.output
    assert json.loads(listed.output.strip().splitlines()[-1])["missing"] == 1
