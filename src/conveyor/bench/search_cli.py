"""`conveyor bench search`: the code-search benchmark's command (heavy imports inside it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def register(bench_app: typer.Typer) -> None:
    """Add the `search` command to the `conveyor bench` app."""
    bench_app.command("search")(search)


def search(
    tasks: Annotated[
        Path | None,
        typer.Option(help="SWE-bench-style JSONL (instance_id, problem_statement, patch)"),
    ] = None,
    repo_root: Annotated[
        Path | None,
        typer.Option(
            help="checkouts: DIR/<instance_id>, or DIR for every row; optional for factory "
            "rows (repo pypi:NAME), which are searched in their own starting state"
        ),
    ] = None,
    synthetic: Annotated[
        list[str] | None,
        typer.Option(help="pseudo-tasks from a project's docstrings: pyparsing, boltons"),
    ] = None,
    count: Annotated[int, typer.Option(min=1, help="synthetic tasks per project")] = 50,
    seed: Annotated[int, typer.Option(help="synthetic task sampling seed")] = 0,
    out: Annotated[Path | None, typer.Option(help="also write the JSON report here")] = None,
) -> None:
    """How often search_code, BM25 alone and grep put the gold file/function in the top k.

    The last line printed is one JSON object.
    """
    from conveyor.bench import search as bench

    if tasks is None and not synthetic:
        raise typer.BadParameter("give --tasks FILE --repo-root DIR, or --synthetic PROJECT")
    report: dict[str, object] = {"benchmark": "search", "ks": list(bench.KS)}
    if tasks is not None:
        try:
            pairs = bench.load_rows(tasks, repo_root)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--repo-root") from exc
        report["rows"] = bench.bench_rows(pairs)
    if synthetic:
        unknown = sorted(set(synthetic) - set(bench.SYNTHETIC_VERSIONS))
        if unknown:
            known = ", ".join(bench.SYNTHETIC_VERSIONS)
            raise typer.BadParameter(f"unknown project {unknown}; known: {known}")
        report["synthetic"] = [bench.bench_synthetic(p, count, seed) for p in synthetic]
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
