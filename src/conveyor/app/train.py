"""`conveyor train CONFIG`: the whole job, from a base model to a trained one, measured.

A run is a checked plan and its phases. `check_plan` decides from the config and the resume
folder what the run will do and refuses what cannot work; `open_run` starts the engine, refuses
what only the parts can say and creates the run folder last, so a refused run leaves no folder.
The phases, in order: reuse another run's warm start (`rl.warm_start.from_run`) -> evaluate the
base model on the held-out split (`eval_before.json`) -> optional supervised warm start on oracle
traces (`sft_model/`) -> resume (the trainer and the RL loop, from the newest checkpoint on
`--resume`) -> evaluate the warm start (`eval_after_sft.json`) -> RL steps (`metrics.jsonl`,
checkpoints) -> evaluate again (`eval_after.json`) -> export the final model (`final_model/`),
then plots and `summary.json`. Evaluations use `rl.eval.temperature` (0 = greedy) and one sample
per held-out instance. `--resume RUN_DIR` skips what is already on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import random
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.app.compose import Composition, check_run_dir, make_run_dir
from conveyor.app.plan import check_gpu_fit
from conveyor.app.reports import eval_report, paired_comparison, wilson_interval
from conveyor.config import (
    ConfigError,
    ConveyorConfig,
    ResolvedConfig,
    SamplingConfig,
    TrainerConfig,
    config_to_yaml,
)
from conveyor.dispatch.stages import RolloutStages
from conveyor.engines.base import SamplingClient
from conveyor.registry import BACKENDS
from conveyor.trainer.loop import RLLoop, StepRecord
from conveyor.trainer.policy_losses import without_off_policy_weights
from conveyor.types import Status, Task, TrainingSample, Trajectory

Say = Callable[[str], None]


async def evaluate(
    parts: Composition,
    stages: RolloutStages,
    tasks: Sequence[Task],
    trajectories_file: Path | None = None,
) -> dict[str, Any]:
    """One rollout per task through the dispatcher; the report of `eval_report`.

    With `trajectories_file`, every rollout is also written there (JSONL) for inspection. With
    `rl.eval.stop_halfwidth` set, the evaluation stops once the instances finished in task order
    (a prefix of `tasks`, so the sample does not favour quick rollouts) number at least
    `rl.eval.min_tasks` and their pass rate's 95% Wilson interval is at most that half-width
    wide; the report then covers that prefix and says so under `stopped_early`.
    """
    start = time.monotonic()
    dispatcher = parts.dispatcher(stages)
    target = parts.config.rl.eval.stop_halfwidth
    least = max(1, parts.config.rl.eval.min_tasks)
    order = {task.id: i for i, task in enumerate(tasks)}
    finished: list[Trajectory | None] = [None] * len(tasks)
    prefix = solved = scored = 0  # the finished prefix, its solved and scored rollouts
    stopped = False
    trajectories: list[Trajectory] = []
    # Streamed, so the records a run got before it stopped (engine down) stay on disk.
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(trajectories_file.open("w")) if trajectories_file else None
        async with contextlib.aclosing(dispatcher.rollouts(tasks, 1)) as stream:
            async for trajectory in stream:
                trajectories.append(trajectory)
                if sink is not None:
                    sink.write(f"{trajectory.to_json()}\n")
                finished[order[trajectory.task_id]] = trajectory
                while prefix < len(tasks) and (done := finished[prefix]) is not None:
                    prefix += 1
                    if done.status is not Status.INFRA_ERROR:
                        scored += 1
                        solved += int(done.solved)
                if target > 0 and least <= prefix < len(tasks) and scored:
                    low, high = wilson_interval(solved, scored)
                    if (high - low) / 2 <= target:
                        stopped = True
                        break
    if stopped:
        kept = [t for t in finished[:prefix] if t is not None]
        report = eval_report(kept, tasks[:prefix])
        report["stopped_early"] = {
            "evaluated": prefix,
            "of": len(tasks),
            "halfwidth_target": target,
            "unfinished_rollouts_cancelled": len(tasks) - len(trajectories),
        }
    else:
        report = eval_report(trajectories, tasks)
    report["seconds"] = time.monotonic() - start
    return report


def export_model(weights: Iterable[tuple[str, Any]], source_dir: Path, target: Path) -> Path:
    """A loadable HF folder: the source's config and tokenizer files plus the given weights."""
    from safetensors.torch import save_file

    tmp = target.with_name(f".tmp-{target.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for item in source_dir.iterdir():
        if item.is_file() and not item.name.endswith((".safetensors", ".bin", ".json.index")):
            shutil.copy2(item, tmp / item.name)
    tensors = {name: tensor.detach().contiguous().clone() for name, tensor in weights}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


async def warm_start_samples(parts: Composition) -> tuple[list[TrainingSample], str]:
    """The warm start's training samples, shuffled, and a line saying what they came from."""
    from conveyor.tasks.family import Demonstrating
    from conveyor.trainer.sft import OracleEngine, oracle_rollouts

    config, tokenizer = parts.config, parts.tokenizer
    tasks = parts.tasks(config.rl.warm_start.tasks, "train")
    # A family with demonstrations (the format, not the plan) is imitated through them, solved
    # or not; every other family through its oracle, whose traces must solve their task.
    demonstrated = {
        task.id for task in tasks if isinstance(parts.families[task.family], Demonstrating)
    }
    calls = {
        task.id: parts.families[task.family].demonstration_calls(task)  # type: ignore[attr-defined]
        if task.id in demonstrated
        else parts.families[task.family].oracle_calls(task)
        for task in tasks
    }
    oracle = OracleEngine(
        calls,
        lambda text: tokenizer.encode(text, add_special_tokens=False),
        tokenizer.eos_token_id,
        config.model.tool_format,
    )
    traces = await oracle_rollouts(parts.stages(engine=oracle), tasks)
    good = [t for t in traces if t.status is Status.OK and (t.solved or t.task_id in demonstrated)]
    samples = [s for t in good for s in t.samples()]
    # One seeded shuffle: consecutive batches mix families and instances (traces come in
    # family order, and a run of one family's batches at a warm-start learning rate drifts).
    random.Random(config.trainer.seed).shuffle(samples)
    solved = sum(t.solved for t in good)
    shown = f", {len(demonstrated)} of them demonstrations" if demonstrated else ""
    return samples, (
        f"warm start: {len(good)}/{len(traces)} traces kept ({solved} solve their task{shown}); "
        f"{len(samples)} samples, {sum(len(s.input_ids) for s in samples)} tokens"
    )


def warm_start_settings(config: ConveyorConfig) -> TrainerConfig:
    """The trainer's settings for the warm start: its learning rate, the blocks it trains
    (`rl.warm_start.train_last_layers`; `all` is full fine-tuning, without LoRA adapters), and
    no truncated importance sampling (its samples are the demonstrations, not the engine's)."""
    settings = config.rl.warm_start
    last = settings.train_last_layers
    update: dict[str, Any] = {
        "lr": settings.lr,
        "loss": without_off_policy_weights(config.trainer.loss),
    }
    if last == "all":
        # Full fine-tuning: every weight, no LoRA adapters (a LoRA run's RL starts from it).
        update["train_last_layers"] = None
        update["lora"] = config.trainer.lora.model_copy(update={"enabled": False})
    elif last is not None:
        update["train_last_layers"] = last
    return config.trainer.model_copy(update=update)


# What a warm start and the evaluations around it are made of; a run that reuses another's warm
# start must agree on all of it: the warm start's own section (less where it comes from) and the
# held-out evaluations' sizes, temperature and early stop. RL-phase settings (trainer.lr, the loss,
# rl.steps, rl.mode, rl.controls, tasks.num_tasks, tasks.group_size, the engine...) may differ:
# those are arms.
_WARM_START_RL_KEYS = {
    "warm_start": ("steps", "tasks", "batch_size", "lr", "train_last_layers"),
    "eval": ("tasks", "before_tasks", "temperature", "stop_halfwidth", "min_tasks"),
}
# Trainer settings that change how a step is computed, not what it computes.
_TRAINER_MECHANICS = {
    "backend",
    "device",
    "fsdp",
    "fsdp_ranks",
    "gradient_checkpointing",
    "micro_batch_tokens",
}
# Files of a run's warm start and its evaluations, copied by `rl.warm_start.from_run`.
_WARM_START_FILES = (
    "eval_before.json",
    "eval_before.trajectories.jsonl",
    "sft_metrics.jsonl",
    "eval_after_sft.json",
    "eval_after_sft.trajectories.jsonl",
)


def warm_start_identity(config: ConveyorConfig) -> dict[str, Any]:
    """The settings a warm start and its evaluations depend on, as flat `section.key` values."""
    tasks = config.tasks.model_dump(mode="json", exclude={"num_tasks", "group_size", "split"})
    trainer = warm_start_settings(config).model_dump(
        mode="json", exclude=_TRAINER_MECHANICS | {"loss"}
    )
    return _flat(
        {
            "model": config.model.model_dump(mode="json"),
            "agent": config.agent.model_dump(mode="json"),
            "tasks": tasks,
            "plugins": config.plugins,
            "sampling": {"sampling_seed": config.sampling.sampling_seed},
            "rl": {
                section: {key: getattr(getattr(config.rl, section), key) for key in keys}
                for section, keys in _WARM_START_RL_KEYS.items()
            },
            # the warm start's trainer: trainer.* with rl.warm_start.lr / .train_last_layers in
            "trainer": trainer,
        }
    )


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def warm_start_source(config: ConveyorConfig, resume: Path | None = None) -> Path | None:
    """`rl.warm_start.from_run`, checked: a finished warm start made with this run's settings,
    in another folder than this run's own (`resume`, else `run.dir`)."""
    from conveyor.config import load_config

    if config.rl.warm_start.from_run is None:
        return None
    source = Path(config.rl.warm_start.from_run).expanduser().resolve()
    key = "rl.warm_start.from_run"
    if not config.rl.warm_start.steps:
        raise ConfigError(f"{key} with rl.warm_start.steps=0: there is no warm start to reuse")
    own = resume if resume is not None else config.run.dir
    if own is not None and source == Path(own).expanduser().resolve():
        raise ConfigError(f"{key}={source} is this run's own folder")
    if not (source / "config.yaml").is_file():
        raise ConfigError(f"{key}={source} is not a training run folder (no config.yaml)")
    if not (source / "sft_model").is_dir():
        raise ConfigError(
            f"{key}={source} has no sft_model/: its warm start has not finished (or it had none)"
        )
    theirs = warm_start_identity(load_config(source / "config.yaml").config)
    ours = warm_start_identity(config)
    differ = [k for k in sorted(ours.keys() | theirs.keys()) if ours.get(k) != theirs.get(k)]
    if differ:
        shown = "; ".join(f"{k}: {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in differ)
        raise ConfigError(
            f"{key}={source}: its warm start was made with other settings ({shown}); a reused "
            "warm start must match on the model, tasks, agent, evaluations and warm start"
        )
    return source


def adopt_warm_start(source: Path | None, run_dir: Path, say: Say) -> None:
    """`rl.warm_start.from_run`: copy the warm start and evaluations of `source` (as checked
    by `warm_start_source`) into `run_dir`, what `run_dir` lacks; nothing when None."""
    if source is None:
        return
    copied = []
    if not (run_dir / "sft_model").is_dir():
        tmp = run_dir / ".tmp-sft_model"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source / "sft_model", tmp)
        tmp.rename(run_dir / "sft_model")
        copied.append("sft_model/")
    for name in _WARM_START_FILES:
        if (source / name).is_file() and not (run_dir / name).is_file():
            # via a temporary name: a copy cut short by a kill is not taken as done on resume
            shutil.copy2(source / name, run_dir / f".tmp-{name}")
            (run_dir / f".tmp-{name}").replace(run_dir / name)
            copied.append(name)
    _write(run_dir / "warm_start_from.json", {"source": str(source), "copied": copied})
    say(f"warm start: reused from {source} ({', '.join(copied) or 'already here'})")


async def warm_start(parts: Composition, run_dir: Path, say: Say) -> Path:
    """Supervised fine-tuning on oracle traces (or a family's demonstrations); returns the
    exported `sft_model` folder."""
    from conveyor.trainer.backend import TrainBatch
    from conveyor.trainer.jsonl import append_records

    config, model_dir = parts.config, parts.model_dir
    settings = config.rl.warm_start
    samples, said = await warm_start_samples(parts)
    say(said)
    backend = parts.trainer(model_dir, warm_start_settings(config))
    size = settings.batch_size
    log = run_dir / "sft_metrics.jsonl"
    # A warm start killed before its `sft_model` was published runs again from its first step.
    log.unlink(missing_ok=True)
    for step in range(settings.steps):
        start = (step * size) % len(samples)
        chunk = [samples[(start + i) % len(samples)] for i in range(min(size, len(samples)))]
        # Advantage 1 and fresh old logprobs: the PPO gradient is exactly the NLL gradient.
        result = await asyncio.to_thread(backend.step, TrainBatch(items=[(s, 1.0) for s in chunk]))
        append_records(log, [{"step": step + 1, **result.as_dict("sft/")}])
        say(
            # Oracle traces carry no behaviour logprobs (0.0): the agreement probe's mean
            # |trainer logprob - 0| is then the mean NLL of the oracle tokens.
            f"warm start step {step + 1}/{settings.steps}: nll {result.logprob_diff_mean:.3f}, "
            f"{result.tokens_per_s:.0f} tok/s"
        )
    exported = export_model(backend.export_weights(), model_dir, run_dir / "sft_model")
    stop = getattr(backend, "close", None)
    # Trainer workers hold their nodes' trainer units, which the RL trainer needs next.
    if callable(stop) and inspect.isawaitable(done := stop()):
        await done
    return exported


@dataclass(frozen=True)
class TrainingPlan:
    """What a training run will do, decided from its config and resume folder alone.

    `check_plan` makes it and refuses what the config and the folders already say cannot work;
    `open_run` refuses what only the parts can say (the cluster, the engine) and creates the run
    folder as its last act. So no refusal leaves a run folder behind, and the phases after it
    only read their decisions from here.
    """

    config: ConveyorConfig
    resume: Path | None  # the run folder `--resume` continues
    reused: Path | None  # `rl.warm_start.from_run`, checked: a warm start this run could have made
    eval_tasks: int  # held-out instances per family after the warm start and after RL; 0: none
    before_tasks: int  # the first of them the base model is evaluated on; 0: none

    @property
    def training(self) -> bool:
        """Whether anything trains (RL steps or a warm start): the engine must then take
        weights and the backend must be able to train here."""
        rl = self.config.rl
        return bool(rl.steps or rl.warm_start.steps)

    @property
    def samples(self) -> bool:
        """Whether the run samples from the engine (RL steps or a held-out evaluation). A warm
        start alone trains on oracle traces: it starts no engine (a vLLM start it never used
        was ~20 s of every `conveyor sft ... rl.eval.tasks=0`)."""
        return bool(self.config.rl.steps or self.eval_tasks or self.before_tasks)


def check_plan(resolved: ResolvedConfig, resume: Path | None = None) -> TrainingPlan:
    """The run's plan, or the refusal of a config that cannot train, before any part starts."""
    from conveyor.trainer.faults import armed

    config = resolved.config
    rl = config.rl
    armed()  # a malformed fault-injection setting fails here, not at its kill point
    if resume is not None and not (resume / "config.yaml").is_file():
        raise FileNotFoundError(f"{resume} is not a training run folder (no config.yaml)")
    if resume is None:
        check_run_dir(config)
    if rl.steps and config.sampling.top_p < 1:
        # vLLM's processed logprobs are taken after the nucleus cut; the trainer's are not.
        raise ConfigError(
            f"sampling.top_p={config.sampling.top_p:g}: RL needs top_p 1, since the trainer's "
            "logprobs have no nucleus cut and would not match the engine's behaviour logprobs"
        )
    if rl.warm_start.steps and not BACKENDS.spec(config.trainer.backend.name).warm_start:
        # The warm start hands RL an exported model folder; a service keeps its weights.
        raise ConfigError(
            f"rl.warm_start.steps={rl.warm_start.steps} with trainer.backend "
            f"{config.trainer.backend.name!r}: the warm start exports a model folder, which "
            "that backend does not; set rl.warm_start.steps=0, or warm-start with "
            "trainer.backend builtin and point model.path at its sft_model/"
        )
    # The base model's evaluation may be shorter: the first instances of the held-out ones (a
    # larger n extends a smaller one), or none.
    held_out = rl.eval.tasks
    before = held_out if rl.eval.before_tasks is None else rl.eval.before_tasks
    plan = TrainingPlan(
        config=config,
        resume=resume,
        reused=warm_start_source(config, resume),  # checked before the engine's minute
        eval_tasks=held_out,
        before_tasks=min(before, held_out) if before and held_out else 0,
    )
    if plan.training and not (info := BACKENDS.spec(config.trainer.backend.name).info()).train:
        raise ConfigError(
            f"trainer.backend {config.trainer.backend.name!r} cannot train here: {info.reason} "
            "(`conveyor backends` lists what can)"
        )
    if plan.training:
        check_gpu_fit(config)  # `conveyor plan`'s refusal, only where the trainer is on a GPU
    return plan


@dataclass
class Run:
    """A training run under way: its plan, parts and folder, and what the phases hand on."""

    plan: TrainingPlan
    parts: Composition
    dir: Path
    say: Say
    engine: SamplingClient  # the run's engine, or `NoEngine` when it samples nothing
    train_tasks: list[Task]
    eval_tasks: list[Task]
    before_tasks: list[Task]
    eval_stages: RolloutStages
    started: float
    timings: dict[str, float] = field(default_factory=dict)


async def open_run(plan: TrainingPlan, say: Say) -> Run:
    """Start the parts and refuse what only they can say (`check_parts`, too few training
    tasks); then, last, create the run folder (or take the resumed one)."""
    from conveyor.engines.base import NoEngine, WeightFolder

    config = plan.config
    started = time.monotonic()
    parts = Composition(config)
    try:
        await check_parts(plan, parts)
        engine_start_s = time.monotonic() - started
        engine: SamplingClient = parts.engine if plan.samples else NoEngine()
        train_tasks = parts.tasks(config.tasks.num_tasks, "train")
        if config.rl.steps and config.rl.tasks_per_step > len(train_tasks):
            raise ConfigError(
                f"rl.tasks_per_step={config.rl.tasks_per_step}, but tasks.num_tasks="
                f"{config.tasks.num_tasks} gives only {len(train_tasks)} training tasks"
            )
        eval_tasks = parts.tasks(plan.eval_tasks, "eval") if plan.eval_tasks else []
        before_tasks = parts.tasks(plan.before_tasks, "eval") if plan.before_tasks else []
        if plan.resume is not None:
            run_dir = plan.resume
        else:
            run_dir = make_run_dir(config, "train")
            (run_dir / "config.yaml").write_text(config_to_yaml(config))
        if isinstance(engine, WeightFolder):
            engine.use_weights_dir(run_dir / "weights")
        eval_sampling = SamplingConfig(
            temperature=config.rl.eval.temperature,
            top_p=1.0,
            sampling_seed=config.sampling.sampling_seed,
        )
        eval_stages = parts.stages(eval_sampling, engine=engine)
    except BaseException:
        await parts.close()
        raise
    return Run(
        plan=plan,
        parts=parts,
        dir=run_dir,
        say=say,
        engine=engine,
        train_tasks=train_tasks,
        eval_tasks=eval_tasks,
        before_tasks=before_tasks,
        eval_stages=eval_stages,
        started=started,
        # without an engine (a warm start alone) that second is the tokenizer's and the trainer's
        timings={"engine_start_s" if plan.samples else "start_s": engine_start_s},
    )


async def check_parts(plan: TrainingPlan, parts: Composition) -> None:
    """The refusals only the parts can give: a cluster that cannot host the run, an engine the
    backend cannot sync into, a server that does not serve the model or takes no weights, a
    model folder without a tokenizer."""
    from conveyor.engines.base import TrainableCheck

    # A cluster that cannot host the run says so before the engine takes its minute.
    parts.start_cluster()
    if not plan.samples:  # nothing to sync into or sample from: no engine to check
        _ = parts.tokenizer
        return
    client = parts.engine
    refusal = parts.backend_spec.refusal(plan.config, client) if plan.training else None
    if refusal is not None:
        # Refused in the first seconds: before the tokenizer, the run folder and any
        # evaluation, since RL needs an engine the backend can sync into and check.
        raise ConfigError(refusal)
    await parts.checked_engine()
    if plan.training and isinstance(client, TrainableCheck):
        # A server: does it take weights (dev-mode reload endpoints, token ids)?
        await client.check_trainable()
    _ = parts.tokenizer


async def held_out(run: Run, tasks: Sequence[Task], name: str, label: str) -> dict[str, Any]:
    """One held-out evaluation, written as `<name>.json` with its trajectories, and said."""
    report = await evaluate(
        run.parts, run.eval_stages, tasks, run.dir / f"{name}.trajectories.jsonl"
    )
    _write(run.dir / f"{name}.json", report)
    rate = report["pass_rate"]
    shown = "no data (every rollout an infrastructure error)" if rate is None else f"{rate:.3f}"
    run.say(f"{label}: pass rate {shown} (n={report['n']})")
    return report


async def evaluate_before(run: Run) -> None:
    """The base model on the first held-out instances, unless already on disk (a resumed run,
    or one that reused another's warm start and its evaluations)."""
    if run.before_tasks and not (run.dir / "eval_before.json").is_file():
        await held_out(run, run.before_tasks, "eval_before", "before")


async def warm_start_phase(run: Run) -> Path:
    """The model folder RL starts from: the base model, or the warm start (`sft_model/`),
    trained here unless it is already on disk (resumed, or reused)."""
    if not run.plan.config.rl.warm_start.steps:
        return run.parts.model_dir
    if not (run.dir / "sft_model").is_dir():
        t0 = time.monotonic()
        await warm_start(run.parts, run.dir, run.say)
        run.timings["sft_s"] = time.monotonic() - t0
    return run.dir / "sft_model"


async def resume_phase(run: Run, start_dir: Path) -> RLLoop:
    """The trainer on `start_dir` and the RL loop, continued from the newest checkpoint on
    `--resume`; the engine then serves the weights RL starts from."""
    from conveyor.trainer.checkpoint import latest_checkpoint, load_checkpoint
    from conveyor.trainer.resume import prepare_resume
    from conveyor.trainer.weight_sync import checked_sync, probe_ids

    config, parts, resume = run.plan.config, run.parts, run.plan.resume
    client = run.engine
    backend = parts.trainer(start_dir)
    # Every sync, the first one after a warm start or resume included, is checked by the
    # weight fingerprint: a sync that did not take stops the run (WeightSyncError).
    sync = (
        checked_sync(
            client,
            backend,
            probe_ids(parts.tokenizer),
            tolerance=config.engine.weight_probe_tolerance,
        )
        if run.plan.training and run.plan.samples
        else _no_weight_sync
    )
    loop = RLLoop(
        config,
        parts.stages(engine=client),
        backend,
        sync,
        run.train_tasks,
        run.dir,
        engine_probe=client,
        on_step=lambda r: run.say(_step_line(r, config.rl.steps)),
    )
    checkpoint = latest_checkpoint(run.dir) if resume is not None else None
    if checkpoint is not None:
        loop.restore(load_checkpoint(checkpoint, backend))
    if resume is not None:
        # Also without a checkpoint: a run killed in its first step starts over from 0.
        resumed = prepare_resume(run.dir, loop.step)
        loop.resume_metrics = resumed.metrics()
        origin = checkpoint.name if checkpoint is not None else "the start (no checkpoint)"
        run.say(
            f"resumed from {origin}: step {loop.step}, cursor {loop.stream.cursor}; "
            f"{resumed.describe()}"
        )
    if run.plan.samples and (checkpoint is not None or start_dir != parts.model_dir):
        # The engine serves the checkpoint's (or warm start's) weights before any rollout.
        await sync(0)
    return loop


async def evaluate_warm_start(run: Run) -> None:
    """The warm start on every held-out instance (`eval_after_sft.json`), the baseline of RL's
    own share, unless already on disk."""
    done = (run.dir / "eval_after_sft.json").is_file()
    if run.eval_tasks and run.plan.config.rl.warm_start.steps and not done:
        await held_out(run, run.eval_tasks, "eval_after_sft", "after warm start")


async def rl_phase(run: Run, loop: RLLoop) -> list[StepRecord]:
    """The RL steps (from the resumed one); their records."""
    t0 = time.monotonic()
    records: list[StepRecord] = await loop.run()
    run.timings["rl_s"] = time.monotonic() - t0
    return records


async def evaluate_after(run: Run, records: Sequence[StepRecord]) -> dict[str, Any] | None:
    """The trained model on the held-out instances; RL's own share (the same instances after
    the warm start and after RL, paired) when a warm start was evaluated and RL ran."""
    if not run.eval_tasks:
        return None
    report = await held_out(run, run.eval_tasks, "eval_after", "after")
    after_sft = run.dir / "eval_after_sft.json"
    if not (after_sft.is_file() and records):
        return None
    share = paired_comparison(json.loads(after_sft.read_text()), report)
    low, high = share["ci95"]
    run.say(
        f"RL's own share: {100 * share['delta']:+.1f} points "
        f"[{100 * low:+.1f}, {100 * high:+.1f}] (95%, paired, n={share['n']}); "
        f"{share['gained']} instances gained, {share['lost']} lost, "
        f"McNemar p={share['mcnemar_p']:.3g}"
    )
    return share


def export_phase(run: Run, loop: RLLoop, start_dir: Path) -> None:
    """The final model as a HF folder (`final_model/`), when `rl.export_final`."""
    if not run.plan.config.rl.export_final:
        return
    try:
        export_model(loop.backend.export_weights(), start_dir, run.dir / "final_model")
    except NotImplementedError as exc:  # weights that live in a service (Tinker)
        run.say(f"no final_model/ folder: {exc}; the last checkpoint names them")


def write_summary(run: Run, records: Sequence[StepRecord], share: dict[str, Any] | None) -> None:
    """The metric plots and `summary.json`: timings, steps, RL's share, runtime starts and
    where the engine's requests went."""
    from conveyor.engines.base import RequestCounters
    from conveyor.engines.router import RoutedEngine
    from conveyor.trainer.report import plot_metrics

    plot_metrics(run.dir)
    run.timings["wall_s"] = time.monotonic() - run.started
    summary: dict[str, Any] = {"timings": run.timings, "steps": len(records)}
    if share is not None:
        summary["rl_share"] = share
    # sandbox starts: how many, how long the start limits held them, warm pool hits
    summary["runtime_starts"] = run.parts.runtime_starts.report()
    client = run.engine
    if isinstance(client, RequestCounters):
        summary["engine_requests"] = client.request_counters()
    if isinstance(client, RoutedEngine):
        # requests, sessions and moved sessions per replica: where the load went
        summary["engine_replicas"] = client.routing_summary()
        summary["weight_sync"] = [r["weight_sync"] for r in summary["engine_replicas"]["replicas"]]
    else:
        # how the last weight sync reached the engine ('collective', 'safetensors', 'direct')
        summary["weight_sync"] = [str(getattr(client, "weight_sync_used", ""))]
    _write(run.dir / "summary.json", summary)


async def run_training(
    resolved: ResolvedConfig, *, resume: Path | None = None, say: Say = print
) -> Path:
    """The whole training job, as its checked plan's phases in order; returns the run folder."""
    plan = check_plan(resolved, resume)
    run = await open_run(plan, say)
    try:
        adopt_warm_start(plan.reused, run.dir, say)
        await evaluate_before(run)
        start_dir = await warm_start_phase(run)
        loop = await resume_phase(run, start_dir)
        await evaluate_warm_start(run)
        records = await rl_phase(run, loop)
        share = await evaluate_after(run, records)
        export_phase(run, loop, start_dir)
    finally:
        await run.parts.close()
    write_summary(run, records, share)
    return run.dir


async def _no_weight_sync(step: int = 0) -> float:
    raise RuntimeError("this engine takes no weights (an evaluation-only run)")


def _step_line(record: StepRecord, total: int) -> str:
    m = record.metrics
    return (
        f"step {record.step}/{total}  reward {m.get('rollout/reward_mean', 0):.3f}  "
        f"pass {m.get('rollout/pass_rate', 0):.3f}  loss {m.get('train/loss', float('nan')):.4f}  "
        f"tok/s {m.get('train/tokens_per_s', 0):.0f}  gen {m.get('time/generation_s', 0):.0f}s  "
        f"step {m.get('time/step_s', 0):.0f}s  stale {m.get('staleness/max', 0):.0f}  "
        f"lp-diff {m.get('train/logprob_diff_mean', float('nan')):.3f}"
    )
