"""The analytic lower bound on the makespan of one swe-sim run.

bound = max(engine, cpu, runtimes, longest), each a time no schedule can beat:

- engine: per replica (perfect balance assumed), every decode step costs `step_base_s` plus
  `step_per_seq_s` per sequence plus `step_per_context_token_s` per context token in the batch,
  and the contexts in one step fit in the KV cache, so the number of steps is at least
  max(sum of contexts over decoded tokens / KV capacity, decoded tokens / max_num_seqs);
  prefill is charged for each turn's new tokens only (perfect prefix caching).
- cpu: init and reward seconds over the CPU slots.
- runtimes: every rollout keeps a runtime alive at least for its shortest lifetime (init, tools,
  reward, and generation at batch-1 speed); the sum of those over R.
- longest: the longest shortest lifetime of one rollout.

The best feasible batch per replica (the reference of engine utilisation) is the KV capacity
over the token-weighted mean context, capped at `max_num_seqs`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from conveyor.bench.swe_sim import SweSimWorkload, plan_rollout


@dataclass(frozen=True, slots=True)
class MakespanBound:
    """The four terms, the bound and the best feasible batch per replica."""

    engine_s: float
    cpu_s: float
    runtimes_s: float
    longest_s: float
    best_batch: float

    @property
    def bound_s(self) -> float:
        """The largest term."""
        return max(self.engine_s, self.cpu_s, self.runtimes_s, self.longest_s)

    @property
    def binding(self) -> str:
        """Which term is the bound."""
        terms = {
            "engine": self.engine_s,
            "cpu": self.cpu_s,
            "runtimes": self.runtimes_s,
            "longest": self.longest_s,
        }
        return max(terms, key=lambda k: terms[k])

    def as_dict(self) -> dict[str, float | str]:
        """JSON-ready, with the bound and its binding term."""
        return {**asdict(self), "bound_s": self.bound_s, "binding": self.binding}


def makespan_bound(workload: SweSimWorkload, seed: int) -> MakespanBound:
    """The bound for the first attempt of every rollout of `workload` under `seed`."""
    w = workload
    tokens = 0
    context_token_sum = 0.0
    prefill = 0
    cpu = 0.0
    lifetimes: list[float] = []
    for task in range(w.tasks):
        for sample in range(w.samples_per_task):
            plan = plan_rollout(w, seed, task, sample, 0)
            context = w.prompt_tokens
            new = w.prompt_tokens
            life = plan.init_s + plan.reward_s
            last = len(plan.turns) - 1
            for index, turn in enumerate(plan.turns):
                n = turn.completion_tokens
                ctx_sum = n * context + n * (n - 1) / 2
                tokens += n
                context_token_sum += ctx_sum
                prefill += new
                life += (
                    w.prefill_per_token_s * new
                    + n * (w.step_base_s + w.step_per_seq_s)
                    + w.step_per_context_token_s * ctx_sum
                )
                context += n
                if index == last and not plan.truncated:
                    break
                life += turn.tool_s
                context += turn.observation_tokens
                new = turn.observation_tokens
            cpu += plan.init_s + plan.reward_s
            lifetimes.append(life)
    steps = max(context_token_sum / w.kv_capacity_tokens, tokens / w.max_num_seqs)
    engine = (
        steps * w.step_base_s
        + tokens * w.step_per_seq_s
        + context_token_sum * w.step_per_context_token_s
        + prefill * w.prefill_per_token_s
    ) / w.engine_replicas
    mean_context = context_token_sum / max(1, tokens)
    best_batch = min(float(w.max_num_seqs), w.kv_capacity_tokens / max(1.0, mean_context))
    return MakespanBound(
        engine_s=engine,
        cpu_s=cpu / w.cpu_slots,
        runtimes_s=sum(lifetimes) / w.max_live_runtimes,
        longest_s=max(lifetimes),
        best_batch=best_batch,
    )
