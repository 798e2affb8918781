"""`conveyor bridge ...`: check a backend's encoding of our samples, export VeRL's dataset,
compare runs of one task set on different backends."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Annotated

import typer

from conveyor.bridges.verl.dataset import register as register_verl_dataset

bridge_app = typer.Typer(
    help="Bridges to other training systems: check encodings, export datasets, compare runs.",
    no_args_is_help=True,
)

# `conveyor bridge export-dataset`: VeRL's parquet of a config's tasks
register_verl_dataset(bridge_app)

# backend name -> module whose `check(trajectories: Path) -> CheckReport` checks it
CHECKERS = {
    "tinker": "conveyor.bridges.tinker",
    "verl": "conveyor.bridges.verl",
    "skyrl": "conveyor.bridges.skyrl",
}


@bridge_app.command("check")
def check_command(
    backend: Annotated[str, typer.Option(help="tinker | verl | skyrl")],
    trajectories: Annotated[
        Path, typer.Option(help="A JSONL of trajectories (a run's trajectories or rollouts file).")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON line.")] = (
        False
    ),
) -> None:
    """Encode the trajectories' samples with BACKEND's own types and check them against ours.

    Exit 0 when every check holds, 1 when one fails, 3 when the backend is unavailable here.
    """
    from conveyor.bridges.report import BridgeUnavailable, CheckReport

    if backend not in CHECKERS:
        typer.secho(
            f"error: unknown backend {backend!r}; choose one of {', '.join(CHECKERS)}",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(code=2)
    if not trajectories.is_file():
        typer.secho(f"error: no trajectories file {trajectories}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2)
    try:
        module = importlib.import_module(CHECKERS[backend])
        report: CheckReport = module.check(trajectories)
    except BridgeUnavailable as exc:
        typer.secho(f"unavailable: {exc}", fg=typer.colors.YELLOW, err=True)
        if as_json:
            typer.echo(json.dumps({"backend": backend, "ok": False, "unavailable": str(exc)}))
        raise typer.Exit(code=3) from None
    for item in report.checks:
        mark = "ok  " if item.ok else "FAIL"
        typer.echo(f"{mark} {item.name}: {item.detail}", err=as_json)
    if as_json:
        typer.echo(report.dumps())
    else:
        typer.echo(
            f"{report.backend} {report.version}: {report.samples} samples, "
            f"{'all checks hold' if report.ok else 'checks FAILED'}"
        )
    raise typer.Exit(code=0 if report.ok else 1)


@bridge_app.command("compare")
def compare_command(
    runs: Annotated[list[Path], typer.Argument(help="Run folders (or trajectories JSONL files).")],
    tol: Annotated[float, typer.Option(help="Largest |logprob difference| accepted.")] = 1e-3,
    as_json: Annotated[bool, typer.Option("--json", help="Last line: the result as JSON.")] = False,
) -> None:
    """Compare runs of one task set turn by turn against the first: ids must be identical,
    logprobs within --tol. Exit 0 iff they are (and every run has the same rollouts)."""
    from conveyor.bridges.compare import compare

    try:
        result = compare(runs)
    except (FileNotFoundError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None
    ok = result.ok(tol)
    for line in result.missing[:10]:
        typer.echo(f"missing: {line}", err=as_json)
    if result.first_mismatch is not None:
        typer.echo(f"first mismatch: {json.dumps(result.first_mismatch)}", err=as_json)
    summary = (
        f"{result.turns} turns, ids {'identical' if result.identical_ids else 'DIFFER'}, "
        f"max |logprob diff| {result.max_abs_logprob_diff:.3g} (tol {tol:g}), pass@1 "
        + " / ".join(f"{p:.3f}" for p in result.pass_at_1)
    )
    typer.echo(summary, err=as_json)
    if as_json:
        typer.echo(json.dumps(result.as_json()))
    raise typer.Exit(code=0 if ok else 1)
