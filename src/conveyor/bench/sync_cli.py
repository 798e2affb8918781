"""`conveyor bench sync`: the weight-sync benchmark's command (heavy imports inside it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def register(bench_app: typer.Typer) -> None:
    """Add the `sync` command to the `conveyor bench` app."""
    bench_app.command("sync")(sync)


def sync(
    model: Annotated[
        str,
        typer.Option(
            help="default (the embedded SmolLM2-135M), tiny-qwen3 (`builtin:tiny-qwen3`: a "
            "random 2-layer Qwen3 with 4 heads of 32, built once) or a HF model folder"
        ),
    ] = "default",
    tensor_parallel: Annotated[
        int,
        typer.Option(
            min=1,
            help="N > 1: sync into an in-process vLLM engine of N tensor-parallel ranks, "
            "collective path only (safetensors_s null); the model's heads must divide by N",
        ),
    ] = 1,
    rounds: Annotated[int, typer.Option(min=1, help="measured syncs per path (median)")] = 4,
    base_url: Annotated[
        str | None,
        typer.Option(
            help="a running dev-mode vLLM server of --model started with --worker-extension-cls "
            "conveyor.engines.weight_group.WeightGroupExtension (default: start one)"
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print only the JSON report")] = False,
    out: Annotated[Path | None, typer.Option(help="also write the JSON report here")] = None,
) -> None:
    """Seconds to sync the trainer's weights into a vLLM server by collectives and by a
    safetensors folder: same weights, same run, order swapped every round, each sync checked by
    its fingerprint.

    The last line printed is one JSON object with `collective_s` and `safetensors_s` (medians),
    `collective_first_s` (the first collective sync, which opens the group) and every figure.
    """
    from conveyor.bench.sync import run_sync_bench

    if model == "default":
        from conveyor.models import check_model_dir, default_model_dir

        model_dir = check_model_dir(default_model_dir())
    elif model == "tiny-qwen3":
        from conveyor.models import prepare_tiny_qwen3

        model_dir = prepare_tiny_qwen3()  # `builtin:tiny-qwen3`, built once in the user cache
    else:
        model_dir = Path(model)
        if not (model_dir / "config.json").is_file():
            raise typer.BadParameter(f"{model_dir} is not a HF model folder", param_hint="--model")
    report = run_sync_bench(
        model_dir, rounds=rounds, base_url=base_url, tensor_parallel=tensor_parallel
    )
    report["model"] = model
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    if not json_out:
        r = report
        safetensors = r["safetensors_s"]
        print(
            f"{r['weight_mb']} MB in {r['tensors']} tensors into a {r['engine']}: collective "
            f"{r['collective_s']:.3f} s, safetensors "
            + ("not measured" if safetensors is None else f"{safetensors:.3f} s")
            + f" (medians of {r['rounds']}; first collective sync "
            f"{r['collective_first_s']:.3f} s)"
        )
    print(json.dumps(report))
