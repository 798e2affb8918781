"""`conveyor bench ...` commands (mounted by the main CLI as the `bench` sub-app).

Kept light at import: the benchmark modules are imported inside the commands.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

bench_app = typer.Typer(help="Measure the dispatcher (and more) against baselines; JSON out.")

_STRATEGIES = "batch,bounded_batch,bounded_batch_overlap,pipeline,auto"


@bench_app.callback()
def _bench() -> None:
    """Benchmarks print JSON and always measure against a baseline in the same run."""


@bench_app.command("dispatch")
def dispatch(
    workload: Annotated[str, typer.Option(help="swe-sim (simulated) or real")] = "swe-sim",
    sweep: Annotated[
        bool, typer.Option(help="also sweep CPU-stage/generation ratio and R")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print only the JSON report")] = False,
    seeds: Annotated[
        int,
        typer.Option(
            min=1,
            help="seeds reported per point (swe-sim: 0..N-1; grid points are chosen on as many "
            "other seeds, 1000..; real: --repeats instead)",
        ),
    ] = 3,
    fresh: Annotated[
        bool,
        typer.Option(
            help="swe-sim: also judge auto against the best grid point on the points fresh for "
            "it (FRESH_POINTS)"
        ),
    ] = True,
    repeats: Annotated[
        int,
        typer.Option(
            min=1,
            help="real workload: rounds over all strategies, each round in a rotated order with "
            "the caches reset between strategies (>= 3 for a spread)",
        ),
    ] = 3,
    out: Annotated[Path | None, typer.Option(help="also write the JSON report here")] = None,
    strategies: Annotated[str, typer.Option(help="comma-separated strategies")] = _STRATEGIES,
    tasks: Annotated[int | None, typer.Option(help="smoke runs only: fewer tasks")] = None,
    processes: Annotated[
        int | None, typer.Option(help="simulation processes (default: cores)")
    ] = None,
    timeline: Annotated[
        Path | None, typer.Option(help="save telemetry + plots of pipeline here")
    ] = None,
    config: Annotated[
        Path, typer.Option(help="real workload: the run config (model, engine, tasks, limits)")
    ] = Path("configs/quickstart-eval.yaml"),
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="real workload: config overrides (key.path=value); swe-sim: workload "
            "parameters (field=value, e.g. max_live_runtimes=256; see docs/dispatch.md)",
        ),
    ] = None,
    replicas: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="swe-sim: engine replicas in the simulated fleet (each with its own KV and "
            "prefix cache), and compare router policies on it (the `routers` block)",
        ),
    ] = None,
) -> None:
    """Compare the dispatch strategies; the last line printed is one JSON object."""
    if workload == "real":
        if replicas is not None:
            raise typer.BadParameter(
                "--replicas applies to --workload swe-sim; a real run's replicas come from its "
                "config (engine.replicas / engine.base_urls)"
            )
        _real(config, set_ or [], strategies, repeats, json_out, out)
        return
    if workload != "swe-sim":
        raise typer.BadParameter(f"unknown workload {workload!r}; known: swe-sim, real")
    from conveyor.bench.dispatch import run_bench
    from conveyor.bench.routers import ROUTER_POLICIES

    base = _sim_workload(set_ or [], tasks, replicas)
    report = run_bench(
        seeds=seeds,
        sweep=sweep,
        processes=processes,
        strategies=_names(strategies),
        workload=base,
        fresh=fresh,
        routers=ROUTER_POLICIES if replicas is not None else (),
    )
    if set_:
        report["workload_overrides"] = list(set_)
    if timeline is not None:
        report["timeline_dir"] = str(_save_timeline(base, report, timeline))
    _emit(report, out, None if json_out else _print_table)


def _sim_workload(overrides: list[str], tasks: int | None, replicas: int | None) -> Any:
    """The swe-sim workload with `--set field=value`, `--tasks` and `--replicas` applied; a
    clear error for an unknown field or a bad value."""
    from pydantic import ValidationError

    from conveyor.sim.swe import SweSimWorkload

    fields: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"--set {item!r}: expected field=value", param_hint="--set")
        fields[key.strip()] = value.strip()
    if tasks is not None:
        fields["tasks"] = tasks
    if replicas is not None:
        fields["engine_replicas"] = replicas
    try:
        return SweSimWorkload(**fields)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise typer.BadParameter(
            f"swe-sim workload: {problems} (fields: {', '.join(SweSimWorkload.model_fields)})",
            param_hint="--set",
        ) from None


def _names(strategies: str) -> tuple[str, ...]:
    """The comma-separated `--strategies` value as names."""
    return tuple(name.strip() for name in strategies.split(",") if name.strip())


def _emit(
    report: dict[str, Any], out: Path | None, table: Callable[[dict[str, Any]], None] | None
) -> None:
    """Write the report to `out` (indented), print `table` (unless --json), then the report as
    one JSON line: the last line every `bench` command prints."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if table is not None:
        table(report)
    print(json.dumps(report, default=str))


@bench_app.command("rl-async")
def rl_async(
    steps: Annotated[int, typer.Option(min=2, help="simulated RL steps")] = 8,
    tasks: Annotated[int, typer.Option(min=1, help="task instances per step")] = 64,
    mfu: Annotated[float, typer.Option(min=0.01, max=1.0, help="trainer MFU")] = 0.4,
    json_out: Annotated[bool, typer.Option("--json", help="print only the JSON report")] = False,
    out: Annotated[Path | None, typer.Option(help="also write the JSON report here")] = None,
) -> None:
    """Sync against async (staleness 1 and 2) RL with separate engine and trainer devices,
    simulated: swe-sim generation, a stated trainer model (conveyor.bench.rl_async)."""
    from conveyor.bench.rl_async import TrainerModel, run_rl_async
    from conveyor.sim.swe import SweSimWorkload

    report = run_rl_async(steps, SweSimWorkload(tasks=tasks), TrainerModel(mfu=mfu))
    _emit(report, out, None if json_out else _rl_async_table)


def _rl_async_table(report: dict[str, Any]) -> None:
    print(
        f"{report['steps']} steps of {report['rollouts_per_step']} rollouts: generation "
        f"{report['generation_s']['mean']:.0f}s, update {report['update_s']['mean']:.0f}s "
        "per step (means)"
    )
    for name, m in report["modes"].items():
        print(
            f"{name:<20} {m['step_s']:7.1f}s/step  x{m['speedup_over_sync']:.2f} over sync  "
            f"training overlapped {100 * m['train_overlapped_fraction']:.0f}%"
        )


@bench_app.command("dispatch-scale")
def dispatch_scale(
    trajectories: Annotated[int, typer.Option(min=8, help="simulated rollouts")] = 10_000,
    strategies: Annotated[str, typer.Option(help="comma-separated strategies")] = "pipeline,auto",
    json_out: Annotated[bool, typer.Option("--json", help="print only the JSON report")] = False,
    out: Annotated[Path | None, typer.Option(help="also write the JSON report here")] = None,
) -> None:
    """Wall time of the dispatcher on many simulated rollouts (virtual clock), against
    bounded_batch in the same run; the last line printed is one JSON object."""
    from conveyor.bench.dispatch_scale import run_scale

    _emit(run_scale(trajectories, _names(strategies)), out, None if json_out else _scale_table)


def _scale_table(report: dict[str, Any]) -> None:
    for name, s in report["strategies"].items():
        print(
            f"{name:<14} {report['trajectories']} rollouts in {s['wall_s']:6.1f}s wall "
            f"(target < {report['target_wall_s']:.0f}s: {'met' if s['met'] else 'MISSED'}), "
            f"all accounted: {s['accounted']}, statuses {s['statuses']}"
        )


def _real(
    config: Path,
    overrides: list[str],
    strategies: str,
    repeats: int,
    json_out: bool,
    out: Path | None,
) -> None:
    import asyncio

    from conveyor.bench.real import run_real
    from conveyor.config import load_config

    resolved = load_config(config, overrides)
    report = asyncio.run(run_real(resolved.config, _names(strategies), repeats=repeats))
    _emit(report, out, None if json_out else _real_table)


def _real_table(report: dict[str, Any]) -> None:
    for name, s in report["strategies"].items():
        makespan = s["makespan_s"]
        print(
            f"{name:<22} makespan {makespan['mean']:7.1f}s [{makespan['min']:.1f}-"
            f"{makespan['max']:.1f}] x{s['runs']}  util {s['engine_utilisation']['mean']:.2f}"
            f"  first group {s['first_group_fraction']['mean']:.2f}  reward {s['mean_reward']:.2f}"
            f"  {' '.join(f'{k}={v}' for k, v in sorted(s['statuses'].items()))}"
        )
    for name, r in report["ratios"].items():
        print(f"{name}: {r['mean']:.3f} [{r['min']:.3f}-{r['max']:.3f}], std {r['std']:.3f}")


def _save_timeline(base: Any, report: dict[str, Any], folder: Path) -> Path:
    from conveyor.bench.dispatch import simulate
    from conveyor.dispatch.plot import plot_timeline
    from conveyor.dispatch.telemetry import Telemetry

    name = "pipeline" if "pipeline" in report["strategies"] else next(iter(report["strategies"]))
    telemetry = Telemetry()
    simulate(base, name, report["strategies"][name]["best_knobs"], 0, telemetry)
    telemetry.meta = {"strategy": name, "knobs": report["strategies"][name]["best_knobs"]}
    telemetry.save(folder)
    plot_timeline(folder)
    return folder


def _print_table(report: dict[str, Any]) -> None:
    print(
        f"swe-sim: {report['trajectories']} trajectories, seeds {report['seeds']}, "
        f"bound {report['bound_s']:.0f}s ({report['bound_terms']['binding']}), "
        f"runtime-engine bound {report['tight_bound_s']:.0f}s"
    )
    print(
        f"{'strategy':<14}{'makespan_s':>11}{'traj/h':>9}{'eff':>7}{'util':>7}"
        f"{'effT':>7}{'peakR':>7}{'1st grp':>9}  best knobs"
    )
    for name, s in report["strategies"].items():
        print(
            f"{name:<14}{s['makespan_s']:>11.0f}{s['throughput'] * 3600:>9.0f}"
            f"{s['efficiency']:>7.3f}{s['engine_utilisation']:>7.3f}{s['efficiency_tight']:>7.3f}"
            f"{s['peak_live_runtimes']:>7.0f}{s['first_group_fraction']:>9.2f}  {s['best_knobs']}"
        )
    print(f"ratios: {report.get('ratios')}")
    if "auto_vs_best_grid_on_fresh" in report:
        print(f"auto vs best grid point, fresh points: {report['auto_vs_best_grid_on_fresh']}")
    if "routers" in report:
        setup = report["routers_setup"]
        print(
            f"routers: {setup['strategy']} {setup['knobs']} on {setup['engine_replicas']} "
            f"replicas, seeds {setup['seeds']}"
        )
        print(f"{'router':<16}{'makespan_s':>11}{'min-max':>15}{'traj/h':>9}{'recomputed':>12}")
        for name, r in report["routers"].items():
            spread = f"{r['makespan_min_s']:.0f}-{r['makespan_max_s']:.0f}"
            print(
                f"{name:<16}{r['makespan_s']:>11.0f}{spread:>15}{r['throughput'] * 3600:>9.0f}"
                f"{r['prefill_tokens_recomputed']:>12.0f}  {r['recomputed_by_cause']}"
            )
