"""Where training metrics go: `metrics.jsonl` always; TensorBoard and W&B (offline) when asked.

The JSONL file is the record of truth (a resume truncates it to the checkpoint's step; each
line is one fsynced append, so a kill never leaves a torn line inside it); the other sinks are
views of it and are imported only when configured.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from conveyor.trainer.jsonl import append_records


class Tracker:
    """Appends one JSON line per step and mirrors it to the configured dashboards."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = False, wandb: bool = False) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._tb: Any = None
        self._wandb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise RuntimeError(
                    "rl.logging.tensorboard needs the tensorboard package: pip install tensorboard"
                ) from exc
            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as exc:
                raise RuntimeError(
                    "rl.logging.wandb needs the wandb package: pip install wandb"
                ) from exc
            self._wandb = wandb_module.init(
                dir=str(run_dir),
                mode="offline",
                project="conveyor",
                name=run_dir.name,
                resume="allow",
                id=run_dir.name,
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step's metrics (non-finite values become null in JSON)."""
        clean = {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}
        append_records(self.path, [{"step": step, **clean}])
        if self._tb is not None:
            for key, value in metrics.items():
                if math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in clean.items() if v is not None}, step=step)

    def close(self) -> None:
        """Flush and close the dashboards."""
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
