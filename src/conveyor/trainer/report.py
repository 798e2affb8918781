"""PNG plots of a training run from its `metrics.jsonl` (matplotlib, imported lazily)."""

from __future__ import annotations

from pathlib import Path

from conveyor.trainer.jsonl import read_records


def plot_metrics(run_dir: Path) -> list[Path]:
    """Reward and pass rate over steps, plus loss and logprob agreement; returns the PNG paths."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = read_records(path)
    if not rows:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [row["step"] for row in rows]
    panels = [
        ("reward.png", "reward and pass rate", ["rollout/reward_mean", "rollout/pass_rate"]),
        ("loss.png", "loss", ["train/loss"]),
        (
            "logprob_agreement.png",
            "|trainer - engine| logprob",
            ["train/logprob_diff_mean", "train/logprob_diff_max"],
        ),
    ]
    out: list[Path] = []
    folder = run_dir / "plots"
    folder.mkdir(exist_ok=True)
    for name, title, keys in panels:
        figure, axis = plt.subplots(figsize=(6, 3.5))
        for key in keys:
            values = [row.get(key) for row in rows]
            if any(v is not None for v in values):
                axis.plot(
                    steps, [float("nan") if v is None else v for v in values], marker="o", label=key
                )
        axis.set_xlabel("step")
        axis.set_title(title)
        axis.legend()
        figure.tight_layout()
        figure.savefig(folder / name, dpi=100)
        plt.close(figure)
        out.append(folder / name)
    return out
