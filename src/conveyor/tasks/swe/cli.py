"""`conveyor tasks`: build SWE tasks from PyPI sdists, and grade a patch against a task row.

The lead mounts `tasks_app` as `conveyor tasks`. Heavy work is imported inside the commands.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

if TYPE_CHECKING:
    from conveyor.config import RuntimeConfig
    from conveyor.tasks.swe.grading import GradingOptions

tasks_app = typer.Typer(
    help="Make SWE-bench-style tasks offline from PyPI sdists, and grade patches against them.",
    no_args_is_help=True,
)


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


@tasks_app.command("build")
def build(
    project: Annotated[str, typer.Option(help="PyPI project whose sdist ships its tests.")],
    out: Annotated[Path, typer.Option(help="JSONL file to write the task rows to.")],
    version: Annotated[str | None, typer.Option(help="Base release (default: the newest).")] = None,
    mutations: Annotated[int, typer.Option(help="Procedural-bug tasks to make.")] = 50,
    release_pairs: Annotated[
        bool, typer.Option(help="Also make release-pair tasks (tests of N+1 failing on N).")
    ] = False,
    max_pairs: Annotated[int, typer.Option(help="Consecutive release pairs to try.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the mutant order.")] = 0,
    workers: Annotated[int, typer.Option(help="Mutants evaluated at once.")] = 2,
    max_kind_share: Annotated[
        float, typer.Option(help="Largest share of tasks of one mutation kind (1: no cap).")
    ] = 0.3,
    max_trials: Annotated[
        int | None, typer.Option(help="Mutants to try at most (default: 8 per task, 40 or more).")
    ] = None,
    hide_tests: Annotated[
        bool, typer.Option(help="Remove the FAIL_TO_PASS test files from the starting state.")
    ] = True,
) -> None:
    """Build tasks; prints progress, then the yield report as JSON on the last line."""
    from conveyor.tasks.swe.dataset import write_rows
    from conveyor.tasks.swe.factory import build_mutation_tasks, prepare_project
    from conveyor.tasks.swe.projects import BuildReport, spec_for
    from conveyor.tasks.swe.release_pairs import build_release_pair_tasks

    async def main() -> tuple[list, BuildReport]:  # type: ignore[type-arg]
        spec = spec_for(project)
        ctx = await asyncio.to_thread(prepare_project, spec, version)
        report = BuildReport(ctx.name, ctx.version)
        rows = []
        if mutations > 0:
            rows += await build_mutation_tasks(
                ctx,
                mutations,
                seed=seed,
                workers=workers,
                hide_tests=hide_tests,
                max_trials=max_trials,
                max_kind_share=max_kind_share,
                report=report,
                say=typer.echo,
            )
        if release_pairs:
            pairs = await build_release_pair_tasks(
                spec, ctx.version, max_pairs=max_pairs, report=report, say=typer.echo
            )
            rows += pairs
        return rows, report

    rows, report = asyncio.run(main())
    write_rows(out, rows)
    typer.echo(f"wrote {len(rows)} tasks to {out}")
    typer.echo(report.to_json())


GRADING_KEY = "tasks.options.swe.grading"


@tasks_app.command("grade")
def grade_command(
    tasks: Annotated[Path, typer.Option(help="JSONL (or parquet) file of task rows.")],
    instance: Annotated[str, typer.Option(help="instance_id of the row to grade.")],
    patch: Annotated[
        Path | None, typer.Option(help="Unified diff to grade (default: the empty patch).")
    ] = None,
    gold: Annotated[bool, typer.Option(help="Grade the row's own gold patch.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Last line: the JSON summary.")] = False,
    config: Annotated[
        Path | None,
        typer.Option(help=f"A run's YAML config: grade with its {GRADING_KEY} settings."),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help=f"A grading setting, a key of {GRADING_KEY} (the prefix may be written out): "
            "--set run_timeout_s=1200 (repeatable; after --config, before the flags below); "
            "or a runtime setting: --set runtime.kind=container grades in the row's own "
            "container image (built first when missing; runtime.engine, runtime.image too).",
        ),
    ] = None,
    partial_credit: Annotated[
        bool | None, typer.Option(help="Report F2P share as reward (grading.partial_credit).")
    ] = None,
    test_timeout: Annotated[
        float | None, typer.Option(help="Seconds per test (grading.per_test_timeout_s; 30).")
    ] = None,
    semantics: Annotated[
        str | None,
        typer.Option(
            help="strict: only a real pass counts (the RL reward); swebench: xfailed counts as "
            "passing too, as in SWE-bench's report (grading.semantics; strict)."
        ),
    ] = None,
) -> None:
    """Build the task's workspace, apply the patch, run its tests and report (exit 0 when graded,
    resolved or not; 2 on a bad row, file or setting, or a broken task: its test patch does not
    apply). The grading settings are those of a run (`tasks.options.swe.grading`): from
    `--config`, then `--set`, then the flags."""
    from conveyor.tasks.swe.dataset import find_row
    from conveyor.tasks.swe.grading import UNSANDBOXED_WARNING, grade
    from conveyor.types import TaskDefect

    if semantics is not None and semantics not in ("strict", "swebench"):
        _fail(f"--semantics must be strict or swebench, not {semantics!r}")
    flags = {
        "partial_credit": partial_credit,
        "per_test_timeout_s": test_timeout,
        "semantics": semantics,
    }
    grading_sets = [x for x in set_ or [] if not x.strip().startswith("runtime.")]
    try:
        options = grading_options(config, grading_sets, flags)
        settings = runtime_settings(config, [x for x in set_ or [] if x not in grading_sets])
    except ValueError as exc:
        _fail(str(exc))
    if settings.kind == "container" and options.runtime in ("auto", "container"):
        options = options.in_containers(settings)
    elif options.runtime == "container":
        options = options.in_containers(settings)
    if options.unsandboxed:
        typer.secho(f"WARNING: {UNSANDBOXED_WARNING}", fg=typer.colors.RED, err=True)
    try:
        row = find_row(tasks, instance)
    except (KeyError, FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    # Byte-exact (no newline translation): a patch of a CRLF file must keep its "\r".
    text = row.patch if gold else (_read_patch(patch) if patch else "")
    if options.runtime == "container":
        from conveyor.runtime.images import ImageBuildError
        from conveyor.tasks.swe.images import ensure_row_image

        try:
            image, built = ensure_row_image(row, settings, say=_say)
        except (ImageBuildError, ValueError) as exc:
            _fail(str(exc))
        if built is not None and built.built:
            _say(f"built {image} in {built.seconds:.1f} s")
    try:
        report = asyncio.run(grade(row, text, options))
    except (ValueError, TaskDefect) as exc:
        _fail(str(exc))
    if as_json:
        if report.dropped_paths:
            typer.echo(f"ignored changes: {json.dumps(report.dropped_paths)}", err=True)
        if report.error:
            typer.echo(f"note: {report.error}", err=True)
        if report.collect_errors:
            typer.echo(f"did not collect: {json.dumps(sorted(report.collect_errors))}", err=True)
        typer.echo(json.dumps(report.summary()))
    else:
        verdict = "RESOLVED" if report.resolved else "not resolved"
        typer.echo(
            f"{report.instance_id}: {verdict}; F2P {report.f2p_passed}/{report.f2p_total}, "
            f"P2P {report.p2p_passed}/{report.p2p_total}, {report.seconds:.1f} s"
        )
        for path, why in report.dropped_paths.items():
            typer.echo(f"  ignored change to {path} ({why})")
        for module, why in list(report.collect_errors.items())[:5]:
            typer.echo(f"  did not collect: {module}: {why.strip().splitlines()[-1:]}")
        if report.error:
            typer.echo(f"  {report.error}")
        for nodeid in report.failing[:10]:
            typer.echo(f"  failing: {nodeid}")


def _say(text: str) -> None:
    typer.echo(text, err=True)


def runtime_settings(config: Path | None, settings: list[str]) -> RuntimeConfig:
    """The runtime settings of `conveyor tasks grade`: `config`'s `runtime` section, then each
    `runtime.KEY=VALUE` of `settings`. `ValueError` naming a bad one."""
    from pydantic import ValidationError

    from conveyor.config import RuntimeConfig, load_config

    values: dict[str, Any] = {}
    if config is not None:
        values = load_config(config).config.runtime.model_dump(exclude_unset=True)
    for setting in settings:
        key, eq, raw = setting.partition("=")
        if not eq:
            raise ValueError(f"--set {setting!r}: expected KEY=VALUE, e.g. runtime.kind=container")
        values[key.strip().removeprefix("runtime.")] = yaml.safe_load(raw)
    try:
        return RuntimeConfig.model_validate(values)
    except ValidationError as error:
        why = "; ".join(
            f"runtime.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()
        )
        raise ValueError(why) from None


def _read_patch(path: Path) -> str:
    """A patch file's text, byte for byte (bytes that are not UTF-8 survive as escapes)."""
    return path.read_bytes().decode("utf-8", "surrogateescape")


def grading_options(
    config: Path | None, settings: list[str], flags: dict[str, Any]
) -> GradingOptions:
    """The grading settings of `conveyor tasks grade`: `config`'s `tasks.options.swe.grading`,
    then each `KEY=VALUE` of `settings` (a YAML value), then the `flags` that are not None.
    `ValueError` naming the bad setting (a `ConfigError` for a bad config file)."""
    from conveyor.config import load_config
    from conveyor.tasks.family import family_options
    from conveyor.tasks.swe.grading import GradingOptions

    values: dict[str, Any] = {}
    if config is not None:
        swe = load_config(config).config.tasks.options.get("swe") or {}
        values.update(swe.get("grading") or {})
    for setting in settings:
        key, eq, raw = setting.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--set {setting!r}: expected KEY=VALUE, e.g. run_timeout_s=1200")
        values[key.strip().removeprefix(f"{GRADING_KEY}.")] = yaml.safe_load(raw)
    values.update({key: value for key, value in flags.items() if value is not None})
    return family_options("swe.grading", GradingOptions, values)


@tasks_app.command("export")
def export_command(
    tasks: Annotated[Path, typer.Option(help="JSONL (or parquet) file of task rows.")],
    out: Annotated[Path, typer.Option(help="JSONL file to write the SWE-bench records to.")],
    image: Annotated[
        str | None,
        typer.Option(
            help="Image name template with {instance_id} (default: a row's own image name, "
            "else conveyor/sweb.eval.{instance_id})."
        ),
    ] = None,
) -> None:
    """Write rows (ours or SWE-bench's) as SWE-bench-format records: FAIL_TO_PASS/PASS_TO_PASS
    as JSON strings, environment_setup_commit, image, and swebench 5's eval_script, log_parser
    and eval_type; they load back as the same rows (exit 2 on a bad row or file)."""
    from conveyor.tasks.swe.dataset import load_rows, to_swebench

    try:
        records = [to_swebench(row, image) for row in load_rows(tasks)]
    except (FileNotFoundError, ValueError, KeyError) as exc:
        _fail(str(exc))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    typer.echo(f"wrote {len(records)} SWE-bench records to {out}")


@tasks_app.command("swebench-parity")
def parity_command(
    tasks: Annotated[Path, typer.Option(help="JSONL file of factory (pypi:) pytest rows.")],
    limit: Annotated[int, typer.Option(help="Rows to check at most (file order).")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Last line: the JSON report.")] = False,
) -> None:
    """Grade each row's gold and empty patch twice, with our pytest outcome channel and with
    swebench's log parser over a `pytest -rA` run of the same tests, and compare the verdicts:
    resolved and each F2P/P2P test's status. Exit 0 when they agree everywhere, 1 otherwise."""
    from conveyor.tasks.swe.dataset import load_rows
    from conveyor.tasks.swe.parity import parity_report

    try:
        rows = load_rows(tasks)[:limit]
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    report = asyncio.run(parity_report(rows, say=typer.echo))
    if as_json:
        typer.echo(json.dumps(report))
    else:
        typer.echo(
            f"{report['agree']}/{report['cases']} cases agree (resolved and per test); "
            f"ours resolved {report['ours_resolved']}, swebench's {report['theirs_resolved']}"
        )
    raise typer.Exit(code=0 if report["ok"] else 1)
