"""`bounded_batch_overlap`: the paper's naive batching given the pipeline's first-turn overlap.

A control, not a strategy to run: `pipeline` starts a rollout's first generation beside its
init, a structural step the paper's `bounded_batch` does not take. This variant takes the same
step, so the benchmark can tell how much of the pipeline's lead is the overlap and how much is
the scheduling (docs/dispatch.md, "The first turn beside init").
"""

from __future__ import annotations

from conveyor.dispatch.bounded_batch import BoundedBatchDispatcher
from conveyor.registry import STRATEGIES


@STRATEGIES.register("bounded_batch_overlap")
class BoundedBatchOverlapDispatcher(BoundedBatchDispatcher):
    """`bounded_batch` whose rollouts start their first turn at init start (`early_first_turn`).

    The rollout's own slot bounds its first turn: at most `max_parallel` rollouts are in
    flight, so at most that many sessions are on the engine, as without the overlap.
    """

    overlaps_first_turn = True
