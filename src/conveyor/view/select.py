"""Which training rollouts a page shows: a long run has too many to embed them all.

Evaluations are always shown in full. Training rollouts beyond `max_rollouts` are thinned by
whole steps, evenly spaced and always including the first and the last, so what is shown still
tells how behaviour changed over training and every shown step is complete. The summary numbers
count every rollout; the page says which steps it shows.
"""

from __future__ import annotations

from typing import Any

DEFAULT_MAX_ROLLOUTS = 2000


def shown_trajectories(
    trajectories: list[dict[str, Any]], max_rollouts: int
) -> tuple[list[dict[str, Any]], str | None]:
    """The trajectories to embed, and a note for the page when rollouts were left out."""
    if max_rollouts < 0:
        raise ValueError(f"max_rollouts must be >= 0, got {max_rollouts}")
    rollouts = [t for t in trajectories if t["source"] == "rollouts"]
    if len(rollouts) <= max_rollouts:
        return trajectories, None
    steps = sorted({int(t.get("step") or 0) for t in rollouts})
    per_step = len(rollouts) / len(steps)
    keep = min(len(steps), int(max_rollouts // per_step))
    if keep == 0:
        chosen: set[int] = set()
    elif keep == 1:
        chosen = {steps[-1]}
    else:
        chosen = {steps[round(i * (len(steps) - 1) / (keep - 1))] for i in range(keep)}
    shown = [
        t for t in trajectories if t["source"] != "rollouts" or int(t.get("step") or 0) in chosen
    ]
    kept = len(shown) - (len(trajectories) - len(rollouts))
    note = (
        f"training rollouts of {len(chosen)} of {len(steps)} steps are shown ({kept} of "
        f"{len(rollouts)} rollouts; steps {sorted(chosen)}): --max-rollouts {max_rollouts} sets "
        "the limit. The summary counts every rollout."
    )
    return shown, note
