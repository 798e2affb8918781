"""`conveyor bridge export-dataset`: our tasks as the parquet file VeRL's `RLHFDataset` reads.

One row per task instance:
- `prompt`: the task's opening chat messages (role and content), what VeRL's dataset shows as
  `raw_prompt` and filters by length;
- `agent_name`: "conveyor", so VeRL's worker runs our agent loop on the row;
- `data_source`: "conveyor/FAMILY", and `reward_model` ({"style": "rule", "ground_truth": ""}):
  the columns VeRL's reward bookkeeping groups by; our loop scores the rollout itself, so
  VeRL's reward function never reads them;
- `extra_info`: `index`, `family`, `split`, `task` (the `Task` as JSON: a string, so families
  with different task data share one parquet schema) and `conveyor_config` (the resolved config
  as JSON, overrides applied: VeRL's workers may run on machines without the file; the agent
  loop reads it unless CONVEYOR_CONFIG names a config file).

pyarrow is imported only when writing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from conveyor.tasks.family import SPLIT_SHARES, build_families, options_services

if TYPE_CHECKING:
    from conveyor.config import ConveyorConfig

AGENT_NAME = "conveyor"


def rows(config: ConveyorConfig, *, split: str, n: int | None) -> list[dict[str, Any]]:
    """The dataset rows: `n` instances (default `tasks.num_tasks`) of every configured family."""
    if split not in SPLIT_SHARES:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLIT_SHARES)}")
    count = config.tasks.num_tasks if n is None else n
    if count < 1:
        raise ValueError(f"--n must be at least 1, got {count}")
    resolved = config.model_dump_json()
    families = build_families(
        config.tasks.families, config.runtime, options_services(config.tasks.options)
    )
    out: list[dict[str, Any]] = []
    for family in families.values():
        for task in family.make_tasks(count, config.tasks.task_seed, split):
            out.append(
                {
                    "data_source": f"conveyor/{task.family}",
                    "agent_name": AGENT_NAME,
                    "prompt": [
                        {"role": str(m["role"]), "content": str(m.get("content") or "")}
                        for m in task.prompt
                    ],
                    "reward_model": {"style": "rule", "ground_truth": ""},
                    "extra_info": {
                        "index": len(out),
                        "family": task.family,
                        "split": split,
                        "task": task.model_dump_json(),
                        "conveyor_config": resolved,
                    },
                }
            )
    return out


def export_dataset(config: ConveyorConfig, out: Path, *, split: str, n: int | None) -> int:
    """Write VeRL's parquet of `config`'s tasks to `out`; returns the number of rows."""
    records = rows(config, split=split, n=n)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise RuntimeError(
            "export-dataset needs pyarrow (pip install 'pyarrow>=19'); .venv-verl has it"
        ) from exc
    table = pa.Table.from_pylist(records)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return table.num_rows


def register(bridge_app: typer.Typer) -> None:
    """Add `export-dataset` to the `conveyor bridge` command group."""

    @bridge_app.command("export-dataset")
    def export_dataset_command(
        config: Annotated[Path, typer.Option(help="The Conveyor config whose tasks to export.")],
        out: Annotated[Path, typer.Option(help="The parquet file to write.")],
        split: Annotated[str, typer.Option(help="train | eval | test")] = "train",
        n: Annotated[
            int | None, typer.Option(help="Instances per family (default: tasks.num_tasks).")
        ] = None,
        overrides: Annotated[
            list[str] | None, typer.Option("--set", help="Config override KEY=VALUE.")
        ] = None,
    ) -> None:
        """Write our tasks as VeRL's RLHFDataset parquet, each row run by the `conveyor` agent
        loop (docs/bridges-verl.md)."""
        from conveyor.config import ConfigError, load_config

        try:
            resolved = load_config(config, overrides or [])
            written = export_dataset(resolved.config, out, split=split, n=n)
        except (ConfigError, ValueError, RuntimeError) as exc:
            typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code=2) from None
        typer.echo(json.dumps({"rows": written, "out": str(out), "split": split}))
