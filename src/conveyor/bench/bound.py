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

The four terms are each reachable alone but not together: the engine term needs large batches,
and every request in a batch holds a live runtime. `runtime_engine_s` is a second, tighter lower
bound that couples them (derivation in docs/dispatch.md, "The runtime-engine bound"). A token is
*charged* if its runtime must be alive while it is decoded: every token after the rollout's
first tool call (the first turn reads only the prompt, so a schedule may generate it before
the sandbox exists). With n_t the charged tokens of the step that decodes t and gamma_t =
step_per_seq_s + step_per_context_token_s * (context of t), summing per decode step (the
per-token form of the second line is false; its sum over each step's charged tokens holds):

    replicas * T >= base * sum_t 1/n_t + W          (engine busy time; W = the batch-free work)
    R * T        >= K + sum_t gamma_t * n_t         (runtime-seconds of the charged requests)

where the sums run over charged tokens and K = init + reward + tool seconds + base * charged
tokens + charged prefill seconds. Minimising sum 1/n_t under sum gamma_t n_t <= B gives
(sum_t sqrt(gamma_t))^2 / B, so (replicas * T - W) * (R * T - K) >= base * G^2 with
G = sum_t sqrt(gamma_t); T is the larger root. The KV limit and n_t >= 1 are dropped, so it
stays a lower bound. It assumes the reward holds the rollout's runtime (the dispatcher closes
it after reward); with a grader that scores in a fresh sandbox it need not, and the bound
without that assumption, K without the reward seconds, is `runtime_engine_fresh_grader_s`.
`tight_bound_s` = max(bound_s, runtime_engine_s); `bound_s` keeps the issue's definition.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from conveyor.sim.swe import SweSimWorkload, plan_rollout


@dataclass(frozen=True, slots=True)
class MakespanBound:
    """The four terms, the bound and the best feasible batch per replica; plus the coupled
    runtime-engine term of the tighter second bound."""

    engine_s: float
    cpu_s: float
    runtimes_s: float
    longest_s: float
    best_batch: float
    runtime_engine_s: float = 0.0
    runtime_engine_fresh_grader_s: float = 0.0  # the same, if reward needs no live runtime

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

    @property
    def tight_bound_s(self) -> float:
        """The second bound: the issue's bound or the runtime-engine term, whichever is larger."""
        return max(self.bound_s, self.runtime_engine_s)

    def as_dict(self) -> dict[str, float | str]:
        """JSON-ready, with both bounds and the first one's binding term."""
        return {
            **asdict(self),
            "bound_s": self.bound_s,
            "binding": self.binding,
            "tight_bound_s": self.tight_bound_s,
        }


def _sqrt_gamma_sum(w: SweSimWorkload, context: int, n: int) -> float:
    """A lower bound of sum_{j<n} sqrt(per_seq + per_context * (context + j)): the summand
    grows with j, so each term is at least the integral over the unit interval before it."""
    a, p = w.step_per_seq_s, w.step_per_context_token_s
    if p == 0:
        return n * math.sqrt(a)

    def antiderivative(x: float) -> float:
        return 2.0 / (3.0 * p) * (a + p * x) ** 1.5

    return antiderivative(context + n - 1) - antiderivative(context - 1)


def _runtime_engine_term(w: SweSimWorkload, work: float, held: float, g: float) -> float:
    """Smallest T with (replicas T - work) (R T - held) >= base g^2, both factors positive."""
    e, r = w.engine_replicas, w.max_live_runtimes
    a, b = e * r, -(e * held + r * work)
    c = work * held - w.step_base_s * g * g
    return (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)


def makespan_bound(workload: SweSimWorkload, seed: int) -> MakespanBound:
    """The bound for the first attempt of every rollout of `workload` under `seed`."""
    w = workload
    tokens = 0
    context_token_sum = 0.0
    prefill = 0
    cpu = 0.0
    fixed = 0.0  # init + reward + tool seconds: runtime time that no batch size shortens
    reward_s = 0.0
    sqrt_gamma = 0.0
    held_tokens = 0  # tokens generated after the first tool call (the runtime must be alive)
    held_prefill = 0
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
                if index > 0:
                    sqrt_gamma += _sqrt_gamma_sum(w, context, n)
                    held_tokens += n
                    held_prefill += new
                life += (
                    w.prefill_per_token_s * new
                    + n * (w.step_base_s + w.step_per_seq_s)
                    + w.step_per_context_token_s * ctx_sum
                )
                context += n
                if index == last and not plan.truncated:
                    break
                life += turn.tool_s
                fixed += turn.tool_s
                context += turn.observation_tokens
                new = turn.observation_tokens
            cpu += plan.init_s + plan.reward_s
            fixed += plan.init_s + plan.reward_s
            reward_s += plan.reward_s
            lifetimes.append(life)
    steps = max(context_token_sum / w.kv_capacity_tokens, tokens / w.max_num_seqs)
    engine = (
        steps * w.step_base_s
        + tokens * w.step_per_seq_s
        + context_token_sum * w.step_per_context_token_s
        + prefill * w.prefill_per_token_s
    ) / w.engine_replicas
    prefill_s = prefill * w.prefill_per_token_s
    work = tokens * w.step_per_seq_s + context_token_sum * w.step_per_context_token_s + prefill_s
    held = fixed + held_tokens * w.step_base_s + held_prefill * w.prefill_per_token_s
    mean_context = context_token_sum / max(1, tokens)
    best_batch = min(float(w.max_num_seqs), w.kv_capacity_tokens / max(1.0, mean_context))
    return MakespanBound(
        engine_s=engine,
        cpu_s=cpu / w.cpu_slots,
        runtimes_s=sum(lifetimes) / w.max_live_runtimes,
        longest_s=max(lifetimes),
        best_batch=best_batch,
        runtime_engine_s=_runtime_engine_term(w, work, held, sqrt_gamma),
        runtime_engine_fresh_grader_s=_runtime_engine_term(w, work, held - reward_s, sqrt_gamma),
    )
