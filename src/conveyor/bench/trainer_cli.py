"""The `conveyor bench trainer` command; `register(bench_app)` mounts it on the bench sub-app.

Kept light at import: torch and transformers load inside the command.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer


def register(bench_app: typer.Typer) -> None:
    """Add the `trainer` command to `bench_app`."""
    bench_app.command("trainer")(trainer)


def trainer(
    model: Annotated[
        str, typer.Option(help="default (embedded SmolLM2), tiny, or a HF folder")
    ] = "default",
    steps: Annotated[int, typer.Option(min=1, help="measured steps per side (median)")] = 10,
    warmup: Annotated[int, typer.Option(min=0, help="unmeasured steps per side first")] = 2,
    batch_size: Annotated[int, typer.Option(min=1, help="sequences per step")] = 4,
    seq_len: Annotated[
        int, typer.Option(min=2, help="longest sequence (lengths vary 3/4-1x)")
    ] = 256,
    micro_batch_tokens: Annotated[int, typer.Option(min=1, help="padded tokens per pass")] = 512,
    threads: Annotated[
        int | None, typer.Option(help="torch threads per side (default: all)")
    ] = None,
    quick: Annotated[
        bool, typer.Option(help="tiny random model, 4x32 tokens: a smoke run")
    ] = False,
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="a trainer setting of the engine side, KEY=VALUE (TrainerConfig keys, dotted "
            "for nested: lora.enabled=true, train_last_layers=4); repeatable",
        ),
    ] = None,
    baseline: Annotated[
        str,
        typer.Option(
            help="plain: a hand-written transformers loop; engine: the engine with default "
            "settings (full fine-tuning), to measure --set against it"
        ),
    ] = "plain",
    packing_tasks: Annotated[
        int,
        typer.Option(
            min=0,
            help="padded vs packed (trainer.packing) on the oracle traces of this many "
            "instances of --packing-config's families, after the main comparison; 0: skip "
            "(--quick: 4)",
        ),
    ] = 8,
    packing_config: Annotated[
        Path, typer.Option(help="the config whose tasks and trainer budget the packing part uses")
    ] = Path("configs/filenav.yaml"),
    packing_micro_batch_tokens: Annotated[
        int | None,
        typer.Option(
            min=1, help="the packing part's micro-batch budget (default: the config's trainer's)"
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print only the JSON report")] = False,
    out: Annotated[Path | None, typer.Option(help="also write the JSON report here")] = None,
) -> None:
    """Train-step tokens/s and peak memory of the engine against a plain transformers loop.

    The last line printed is one JSON object with `tokens_per_s`, `baseline_tokens_per_s`,
    `ratio`, `peak_rss_mb` and `packing` ({padded_tok_s, packed_tok_s, padding_fraction, ...}:
    the engine right-padded vs packed on real quickstart trajectories, measured in the same run).
    """
    from conveyor.bench.trainer import (
        TrainerBenchSpec,
        parse_settings,
        run_trainer_bench,
        tiny_model_dir,
    )

    if baseline not in ("plain", "engine"):
        raise typer.BadParameter(
            f"expected plain or engine, got {baseline!r}", param_hint="--baseline"
        )
    try:
        engine_settings = parse_settings(settings or [])
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        raise typer.BadParameter(str(error), param_hint="--set") from error
    temporary: Path | None = None
    if quick:
        model, seq_len, micro_batch_tokens = "tiny", 32, 64
        packing_tasks = min(packing_tasks, 4)
    if packing_tasks and not packing_config.is_file():
        raise typer.BadParameter(
            f"{packing_config} not found (run from the repository root, or --packing-tasks 0)",
            param_hint="--packing-config",
        )
    if model == "tiny":
        temporary = tiny_model_dir()
        model_dir = temporary
    elif model == "default":
        from conveyor.models import check_model_dir, default_model_dir

        model_dir = check_model_dir(default_model_dir())
    else:
        model_dir = Path(model)
        if not (model_dir / "config.json").is_file():
            raise typer.BadParameter(f"{model_dir} is not a HF model folder", param_hint="--model")
    spec = TrainerBenchSpec(
        model_dir=str(model_dir),
        batch_size=batch_size,
        seq_len=seq_len,
        micro_batch_tokens=micro_batch_tokens,
        steps=steps,
        warmup=warmup,
        threads=threads,
        engine_settings=engine_settings,
        baseline=baseline,
        packing_tasks=packing_tasks,
        packing_config=str(packing_config),
        packing_micro_batch_tokens=packing_micro_batch_tokens,
        # the trajectories are tokenized by the model measured (the tiny one shares the
        # embedded model's vocabulary and has no tokenizer of its own)
        packing_model_path=None if model in ("default", "tiny") else str(model_dir),
    )
    try:
        report = run_trainer_bench(spec)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    report["model"] = model
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    if not json_out:
        _print_summary(report)
    print(json.dumps(report))


def _print_summary(report: dict[str, Any]) -> None:
    batch = report["batch"]
    print(
        f"model {report['model']} on {report['device']}: {batch['sequences']} sequences, "
        f"{batch['tokens']} tokens ({batch['padded_tokens']} padded) in "
        f"{batch['micro_batches']} micro-batches"
    )
    if report["engine_settings"]:
        print(f"engine settings {report['engine_settings']}; baseline: {report['baseline']}")
    print(f"{'':<10}{'tokens/s':>12}{'step s':>10}{'peak RSS MB':>14}")
    print(
        f"{'engine':<10}{report['tokens_per_s']:>12.1f}{report['step_s_median']:>10.3f}"
        f"{report['peak_rss_mb']:>14.0f}"
    )
    print(
        f"{'baseline':<10}{report['baseline_tokens_per_s']:>12.1f}"
        f"{report['baseline_step_s_median']:>10.3f}{report['baseline_peak_rss_mb']:>14.0f}"
    )
    print(f"ratio {report['ratio']:.3f} (tokens/s), {report['rss_ratio']:.3f} (peak RSS)")
    packing = report.get("packing")
    if packing:
        print(
            f"packing on {packing['sequences']} real trajectories ({packing['tokens']} tokens, "
            f"{packing['padding_fraction']:.1%} padding at {packing['micro_batch_tokens']} "
            f"tokens a micro-batch): padded {packing['padded_tok_s']:.1f} tokens/s, packed "
            f"{packing['packed_tok_s']:.1f} ({packing['ratio']:.3f}x)"
        )
