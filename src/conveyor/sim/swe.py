"""The swe-sim workload: a model of SWE-agent rollouts, every parameter with its source.

These values were fixed before any strategy was tuned on them and must not be changed to make a
strategy look better; `docs/dispatch.md` renders the same table. "derived" means computed from
public hardware and model facts as shown; "assumption" means our estimate, stated as such.

A rollout draws everything from `random.Random(f"{seed}:{task}:{sample}:{attempt}")`, never from
the clock, so every strategy sees exactly the same rollouts.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

_RUN_SCRIPT = "SkyRL-Agent examples/run_skyrl/run_skyrl_swe.sh"
_ISSUE = "seed dispatcher study (issue 3: init ~30 s, 10-40 turns, tests ~20 s, 32 CPU slots)"


def _p(value: Any, source: str) -> Any:
    return Field(default=value, json_schema_extra={"source": source})


class SweSimWorkload(BaseModel):
    """Parameters of the simulated SWE workload and of the shared resources (identical limits
    for every strategy). Times in seconds, sizes in tokens; log-normals given by median and
    sigma of the underlying normal."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tasks: int = _p(64, f"{_RUN_SCRIPT}: train_batch_size=64")
    samples_per_task: int = _p(8, f"{_RUN_SCRIPT}: n_samples_per_prompt=8")
    init_median_s: float = _p(30.0, f"{_ISSUE}; R2E-Gym/SWE-Gym docker start + repo set-up")
    init_sigma: float = _p(0.3, "assumption: moderate spread of container start times")
    reward_median_s: float = _p(20.0, f"{_ISSUE}: a repository's FAIL_TO_PASS+PASS_TO_PASS run")
    reward_sigma: float = _p(0.4, "assumption: test suites differ in length")
    turns_min: int = _p(10, _ISSUE)
    turns_max: int = _p(40, _ISSUE)
    prompt_tokens: int = _p(
        2500, "assumption: system prompt + tool schemas (~1.5k) + SWE-bench issue text (~1k)"
    )
    completion_median_tokens: float = _p(
        250.0, "assumption: one reasoning paragraph + one tool call per turn (no long thinking)"
    )
    completion_sigma: float = _p(0.8, "assumption (mean = median * e^(sigma^2/2) ~ 344)")
    completion_max_tokens: int = _p(4096, "assumption: per-turn generation budget")
    observation_median_tokens: float = _p(350.0, "assumption: bash/editor output per call")
    observation_sigma: float = _p(1.0, "assumption: occasional long outputs")
    observation_max_tokens: int = _p(2500, "assumption: tool output truncation limit")
    max_context_tokens: int = _p(32768, "Qwen3-32B native context length (model card)")
    tool_median_s: float = _p(1.0, "assumption: bash/editor call in a container")
    tool_sigma: float = _p(1.2, "assumption: heavy tail (agent runs tests itself; mean ~2 s)")
    pass_rate: float = _p(0.35, "assumption: SA-SWE-32B-level resolve rate (~39% reported)")
    cpu_slots: int = _p(32, _ISSUE)
    max_live_runtimes: int = _p(
        128, "assumption: sandbox memory budget; between the seed's P=96 and its 455-512 live"
    )
    engine_replicas: int = _p(4, f"{_RUN_SCRIPT}: NUM_INFERENCE_ENGINES=4, TP_SIZE=4")
    kv_capacity_tokens: int = _p(
        640_000,
        "derived: Qwen3-32B KV = 64 layers*8 heads*128 dim*2*2 B = 256 KiB/token; "
        "4 H100 * 80 GB * 0.8 (gpu_memory_utilization) - 64 GB weights - ~16 GB = ~176 GB",
    )
    max_num_seqs: int = _p(256, "vLLM default max_num_seqs")
    max_batched_tokens: int = _p(16384, f"{_RUN_SCRIPT}: max_num_batched_tokens=16384")
    step_base_s: float = _p(
        0.012, "derived: 16 GB weights/GPU at 3.35 TB/s = 4.8 ms + TP all-reduce + scheduling"
    )
    step_per_seq_s: float = _p(
        8.0e-5, "derived: 64 GFLOP/token / (4 GPU * 989 TFLOP/s * 0.2 decode MFU)"
    )
    step_per_context_token_s: float = _p(
        2.0e-8, "derived: reading 256 KiB of KV per context token at 4 * 3.35 TB/s"
    )
    prefill_per_token_s: float = _p(
        3.2e-5, "derived: 64 GFLOP/token / (4 GPU * 989 TFLOP/s * 0.5 prefill MFU)"
    )
    prefix_caching: bool = _p(True, f"{_RUN_SCRIPT}: enable_prefix_caching=true")
    init_failure_rate: float = _p(0.0, "faults off in the benchmark; the fault tests set them")
    tool_hang_rate: float = _p(0.0, "faults off in the benchmark; the fault tests set them")
    reward_failure_rate: float = _p(0.0, "faults off in the benchmark; the fault tests set them")

    @property
    def trajectories(self) -> int:
        """Rollouts per run."""
        return self.tasks * self.samples_per_task

    def scaled(self, cpu_factor: float = 1.0, live_runtimes: int | None = None) -> SweSimWorkload:
        """A sweep point: CPU-stage (init + reward) times scaled, R changed; nothing else."""
        return self.model_copy(
            update={
                "init_median_s": self.init_median_s * cpu_factor,
                "reward_median_s": self.reward_median_s * cpu_factor,
                "max_live_runtimes": live_runtimes or self.max_live_runtimes,
            }
        )

    @classmethod
    def sources(cls) -> dict[str, tuple[Any, str]]:
        """Parameter name -> (default value, source)."""
        out: dict[str, tuple[Any, str]] = {}
        for name, info in cls.model_fields.items():
            extra = info.json_schema_extra
            source = extra.get("source", "") if isinstance(extra, dict) else ""
            out[name] = (info.default, str(source))
        return out


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """One turn: tokens generated, tool seconds, observation tokens, whether the tool hangs."""

    completion_tokens: int
    tool_s: float
    observation_tokens: int
    tool_hangs: bool


@dataclass(frozen=True, slots=True)
class RolloutPlan:
    """Everything one attempt of one rollout will do, drawn from its own seed."""

    init_s: float
    init_fails: bool
    turns: tuple[TurnPlan, ...]
    truncated: bool
    reward_s: float
    reward_fails: bool
    passed: bool


def plan_rollout(
    workload: SweSimWorkload, seed: int, task: int, sample: int, attempt: int
) -> RolloutPlan:
    """Draw one attempt of one rollout (pure function of its arguments)."""
    w = workload
    rng = random.Random(f"{seed}:{task}:{sample}:{attempt}")

    def lognormal(median: float, sigma: float) -> float:
        return median * math.exp(rng.gauss(0.0, sigma))

    init_s = lognormal(w.init_median_s, w.init_sigma)
    init_fails = rng.random() < w.init_failure_rate
    n_turns = rng.randint(w.turns_min, w.turns_max)
    turns: list[TurnPlan] = []
    context = w.prompt_tokens
    truncated = False
    for _ in range(n_turns):
        completion = min(
            w.completion_max_tokens,
            max(1, round(lognormal(w.completion_median_tokens, w.completion_sigma))),
        )
        observation = min(
            w.observation_max_tokens,
            max(1, round(lognormal(w.observation_median_tokens, w.observation_sigma))),
        )
        tool_s = lognormal(w.tool_median_s, w.tool_sigma)
        hangs = rng.random() < w.tool_hang_rate
        if context + completion > w.max_context_tokens:
            truncated = True
            break
        turns.append(TurnPlan(completion, tool_s, observation, hangs))
        context += completion + observation
    reward_s = lognormal(w.reward_median_s, w.reward_sigma)
    reward_fails = rng.random() < w.reward_failure_rate
    passed = rng.random() < w.pass_rate
    return RolloutPlan(init_s, init_fails, tuple(turns), truncated, reward_s, reward_fails, passed)
