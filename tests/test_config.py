"""Tests of conveyor.config: layering, sources, error messages and the YAML round trip."""

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from conveyor.config import (
    AgentConfig,
    ConfigError,
    ConveyorConfig,
    EngineConfig,
    HintsConfig,
    LossConfig,
    PartChoice,
    RunConfig,
    SamplingConfig,
    TasksConfig,
    config_to_yaml,
    format_config,
    load_config,
)
from conveyor.registry import FAMILIES, FamilySpec

REPO = Path(__file__).resolve().parents[1]


def leaf_keys(model: type[BaseModel] = ConveyorConfig, prefix: str = "") -> list[str]:
    """Every dotted leaf key of a config model, walked independently of the module's own walk."""
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if annotation is PartChoice:
            keys.append(f"{prefix}{name}")  # a part: one key, {name, options} or a name
        elif annotation is BaseModel:
            keys.append(f"{prefix}{name}")  # `engine.options`: the options of the kind's part
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(leaf_keys(annotation, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def section_classes(model: type[BaseModel] = ConveyorConfig) -> set[type[BaseModel]]:
    found = {model}
    for field in model.model_fields.values():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found |= section_classes(annotation)
    return found


def test_no_config_class_mirrors_another() -> None:
    """One class per concept: no two sections share most of their settings (the old
    `TrainerConfig`/`TrainerSettings` pair shared all of them under renamed fields)."""
    classes = sorted(section_classes(), key=lambda c: c.__name__)
    assert len(classes) >= 12  # the walk descended into every section, hints and loss included
    for i, a in enumerate(classes):
        for b in classes[i + 1 :]:
            shared = set(a.model_fields) & set(b.model_fields)
            assert len(shared) <= 2, f"{a.__name__} and {b.__name__} share {sorted(shared)}"
    # the trainer and the loss take the config sections themselves
    from conveyor.trainer import engine, losses

    assert engine.TorchTrainingEngine.__init__.__annotations__["settings"] == "TrainerConfig | None"
    assert losses.policy_loss.__annotations__["settings"] == "LossConfig | None"
    assert "agent.hints.steps_left_threshold" in leaf_keys()


def test_a_name_in_several_sections_suggests_every_home(tmp_path: Path) -> None:
    path = write(tmp_path, "dtype: bfloat16\n")
    with pytest.raises(ConfigError, match=r"did you mean 'engine\.dtype' or 'trainer\.dtype'\?"):
        load_config(path)


def test_every_field_is_documented() -> None:
    def walk(model: type[BaseModel]) -> None:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation)

    walk(ConveyorConfig)


def test_defaults_load_without_a_file() -> None:
    resolved = load_config(None)
    assert resolved.config == ConveyorConfig()
    assert resolved.config.agent.max_turns == 8
    assert resolved.config.tasks.families == ["arithmetic", "filenav"]
    assert resolved.config.engine.kind == "vllm"
    assert resolved.sources == dict.fromkeys(leaf_keys(), "default")


def test_quickstart_config_loads_64_rollouts() -> None:
    path = REPO / "configs" / "quickstart-eval.yaml"
    resolved = load_config(path)
    cfg = resolved.config
    assert cfg.engine.kind == "vllm"
    assert cfg.model.path is None
    assert cfg.tasks.families == ["arithmetic", "filenav"]
    assert len(cfg.tasks.families) * cfg.tasks.num_tasks * cfg.tasks.group_size == 64
    assert cfg.sampling.temperature == 0.7
    assert (cfg.agent.max_turns, cfg.agent.max_completion_tokens) == (6, 192)
    assert cfg.run.dir is None
    assert resolved.sources["agent.max_turns"] == f"file:{path}"
    assert resolved.sources["agent.max_context_tokens"] == "default"


def test_file_then_overrides_precedence_and_sources(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "agent:\n  max_turns: 6\n  tool_timeout_s: 3\n"
        "tasks:\n  families: [arithmetic]\n  group_size: 4\n",
    )
    resolved = load_config(
        path,
        [
            "agent.max_turns=8",
            "agent.max_turns=9",  # later wins over earlier and over the file
            "sampling.sampling_seed=7",
            "tasks.families=[filenav, arithmetic]",
            "model.path=null",
            "agent.hints.enabled=false",
        ],
    )
    cfg, sources = resolved.config, resolved.sources
    assert cfg.agent.max_turns == 9 and sources["agent.max_turns"] == "--set"
    assert cfg.agent.tool_timeout_s == 3.0 and sources["agent.tool_timeout_s"] == f"file:{path}"
    assert cfg.tasks.group_size == 4 and sources["tasks.group_size"] == f"file:{path}"
    assert cfg.tasks.families == ["filenav", "arithmetic"]
    assert sources["tasks.families"] == "--set"
    assert cfg.sampling.sampling_seed == 7 and sources["sampling.sampling_seed"] == "--set"
    assert cfg.model.path is None and sources["model.path"] == "--set"
    assert cfg.agent.hints.enabled is False and sources["agent.hints.enabled"] == "--set"
    assert cfg.agent.max_prompt_tokens == 3072 and sources["agent.max_prompt_tokens"] == "default"
    assert set(sources) == set(leaf_keys())


def test_number_given_to_a_text_key_stays_text() -> None:
    cfg = load_config(None, ["run.dir=007", "model.path=2024"]).config
    assert cfg.run.dir == "007"
    assert cfg.model.path == "2024"


def test_empty_file_and_empty_section_mean_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")).config == ConveyorConfig()
    commented = write(tmp_path, "agent:\n  # max_turns: 4\n", "commented.yaml")
    assert load_config(commented).config == ConveyorConfig()


@pytest.mark.parametrize(
    ("text", "bad_key", "suggestion"),
    [
        ("agnet:\n  max_turns: 4\n", "agnet", "agent"),
        ("agent:\n  max_turn: 4\n", "agent.max_turn", "agent.max_turns"),
        ("agent:\n  hints:\n    enabeld: false\n", "agent.hints.enabeld", "agent.hints.enabled"),
        # the right name in the wrong section: its home
        ("tasks:\n  max_turns: 4\n", "tasks.max_turns", "agent.max_turns"),
        ("group_size: 4\n", "group_size", "tasks.group_size"),
    ],
)
def test_unknown_key_in_file_names_key_and_nearest(
    tmp_path: Path, text: str, bad_key: str, suggestion: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"unknown config key '{bad_key}' (from file:{path}); did you mean '{suggestion}'?"
    )


def test_unknown_key_in_override_names_key_and_nearest() -> None:
    with pytest.raises(ConfigError, match=r"'agnet\.max_turns' \(from --set\).*'agent.max_turns'"):
        load_config(None, ["agnet.max_turns=4"])
    with pytest.raises(ConfigError, match=r"did you mean 'sampling\.temperature'\?"):
        load_config(None, ["sampling.temprature=0.5"])
    with pytest.raises(ConfigError, match=r"'agent\.max_turns\.x'.*'agent\.max_turns'"):
        load_config(None, ["agent.max_turns.x=1"])


def test_unknown_key_without_a_near_one_lists_valid_keys() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'zzz'.*'model', 'engine'"):
        load_config(None, ["zzz=1"])


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("agent:\n  max_turns: many\n", ["'agent.max_turns'", "'many'", "integer", "int > 0"]),
        ("agent:\n  max_turns: '8'\n", ["'agent.max_turns'", "'8'", "int"]),
        ("engine:\n  max_num_seqs: 0\n", ["'engine.max_num_seqs'", " 0 ", "greater than 0"]),
        ("sampling:\n  top_p: 1.5\n", ["'sampling.top_p'", "1.5", "<= 1"]),
        ("agent:\n  hints:\n    enabled: 1\n", ["'agent.hints.enabled'", "boolean", "bool"]),
        ("engine:\n  dtype: fp8\n", ["'engine.dtype'", "'fp8'", "'bfloat16'"]),
        ("tasks:\n  families: [arithmetic, 3]\n", ["'tasks.families[1]'", "string"]),
        ("tasks:\n  families: arithmetic\n", ["'tasks.families'", "list"]),
        ("agent: 3\n", ["'agent'", "section", "mapping", "max_turns"]),
    ],
)
def test_wrong_type_in_file_names_key_value_expectation_and_source(
    tmp_path: Path, text: str, pieces: list[str]
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    for piece in [*pieces, f"file:{path}"]:
        assert piece in message, (piece, message)


def test_wrong_type_in_override_names_the_override_source() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["agent.rollout_timeout_s=soon"])
    message = str(info.value)
    assert "'agent.rollout_timeout_s'" in message and "'soon'" in message
    assert "(from --set)" in message and "expected float > 0" in message


def test_checks_across_keys() -> None:
    with pytest.raises(ConfigError, match=r"agent\.max_completion_tokens from --set.*smaller"):
        load_config(None, ["agent.max_completion_tokens=4096"])
    # the prompt budget plus the completion budget may exceed the context budget
    cfg = load_config(None, ["agent.max_prompt_tokens=4000"]).config
    assert cfg.agent.max_prompt_tokens + cfg.agent.max_completion_tokens > 4096
    with pytest.raises(ConfigError, match=r"engine\.base_url"):
        load_config(None, ["engine.kind=openai"])
    assert load_config(None, ["engine.kind=openai", "engine.base_url=http://h:8000/v1"])
    with pytest.raises(ConfigError, match=r"more than once: arithmetic"):
        load_config(None, ["tasks.families=[arithmetic, arithmetic]"])


def test_override_errors() -> None:
    with pytest.raises(ConfigError, match=r"'agent\.max_turns' is not of the form dotted\.key="):
        load_config(None, ["agent.max_turns"])
    with pytest.raises(ConfigError, match=r"sets the section 'agent' as a whole"):
        load_config(None, ["agent=3"])
    with pytest.raises(ConfigError, match=r"sets the section 'agent\.hints' as a whole"):
        load_config(None, ["agent.hints={enabled: false}"])
    with pytest.raises(ConfigError, match=r"'tasks\.families=\[a' is not valid YAML"):
        load_config(None, ["tasks.families=[a"])


def test_exponent_numbers_without_a_dot_are_floats(tmp_path: Path) -> None:
    # YAML 1.1 reads `1e-4` as text; a learning rate written so must still be a number.
    cfg = load_config(None, ["trainer.lr=1e-4", "rl.warm_start.lr=2E-5"]).config
    assert cfg.trainer.lr == pytest.approx(1e-4) and cfg.rl.warm_start.lr == pytest.approx(2e-5)
    path = write(tmp_path, "trainer:\n  lr: 3e-6\n  eps: -1.5e-8\n")
    with pytest.raises(ConfigError, match=r"'trainer\.eps'"):  # a number, refused by its range
        load_config(path)
    assert load_config(write(tmp_path, "trainer:\n  lr: 3e-6\n")).config.trainer.lr == 3e-6
    # where the key holds text, the text stays as written
    assert load_config(None, ["run.dir=1e5"]).config.run.dir == "1e5"


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=rf"config file '{missing}' does not exist"):
        load_config(missing)


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "agent:\n  max_turns: 4\n  hints: [oops\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"config file '{path}' is not valid YAML" in message
    assert "line 4" in message  # the unclosed flow sequence is found at the end of the file


def test_yaml_key_given_twice_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "tasks:\n  group_size: 2\n  num_tasks: 4\n  group_size: 8\n")
    with pytest.raises(ConfigError, match=r"'group_size' is given twice at line 4"):
        load_config(path)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "- agent\n- tasks\n")
    with pytest.raises(ConfigError, match=r"must hold a mapping of sections .* holds a list"):
        load_config(path)


def test_yaml_round_trip(tmp_path: Path) -> None:
    cfg = ConveyorConfig(
        engine=EngineConfig(kind="openai", base_url="http://localhost:8000/v1", kv_cache_gib=2),
        sampling=SamplingConfig(temperature=0.3, sampling_seed=11),
        agent=AgentConfig(max_turns=3, hints=HintsConfig(on_tool_error=False)),
        tasks=TasksConfig(families=["filenav"], split="train"),
        run=RunConfig(dir="007"),
    )
    for original in (cfg, ConveyorConfig()):
        path = write(tmp_path, config_to_yaml(original), "saved.yaml")
        resolved = load_config(path)
        assert resolved.config == original
        assert set(resolved.sources.values()) == {f"file:{path}"}  # every leaf was written


def test_format_config_lists_every_leaf_with_value_and_source(tmp_path: Path) -> None:
    path = write(tmp_path, "agent:\n  max_turns: 6\n")
    text = format_config(load_config(path, ["run.dir=demo"]))
    lines = text.splitlines()
    for key in leaf_keys():
        assert sum(line.split()[:1] == [key] for line in lines) == 1, key
    assert any(
        "agent.max_turns" in line and "= 6" in line and f"[file:{path}]" in line for line in lines
    )
    assert any("run.dir" in line and '"demo"' in line and "[--set]" in line for line in lines)
    assert any("sampling.top_p" in line and "[default]" in line for line in lines)
    assert "[agent.hints]" in lines and "[tasks]" in lines


def test_import_stays_light() -> None:
    code = (
        "import sys, conveyor.config; "
        "print(sorted(m for m in ('torch', 'vllm', 'ray', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# --- deadlines and bounds, checked at start (issue 14) ---------------------------------------


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_passes_the_start_check(path: Path) -> None:
    load_config(path)


def test_settings_that_cannot_work_are_refused_in_one_message_naming_every_key() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(
            None,
            [
                "tasks.families=[swe]",
                "dispatch.p_run=16",
                "dispatch.max_live_runtimes=8",
                "agent.tool_timeout_s=700",
                "agent.rollout_timeout_s=600",
                "dispatch.reward_timeout_s=900",
            ],
        )
    message = str(caught.value)
    for fragment in (
        "dispatch.max_live_runtimes (8) is below the run pool dispatch.p_run (16)",
        "agent.tool_timeout_s (700) exceeds agent.rollout_timeout_s (600)",
        # the swe grader's pytest run (900 s) plus its set-up: the policy's slow tests must be
        # scored, not turned into a retried infrastructure error by the dispatcher's deadline
        "dispatch.reward_timeout_s (900) is below the 'swe' family's grading budget (960 s)",
        "dispatch.max_live_runtimes from --set",
        "dispatch.reward_timeout_s from --set",
    ):
        assert fragment in message, message
    assert message.count("invalid config") == 1


def test_each_bound_alone_is_refused_and_the_edge_is_accepted() -> None:
    with pytest.raises(ConfigError, match=r"dispatch\.max_parallel \(32\) of strategy 'batch'"):
        load_config(
            None,
            [
                "dispatch.strategy=batch",
                "dispatch.max_live_runtimes=31",
                "dispatch.max_parallel=32",
            ],
        )
    load_config(
        None,
        [
            "dispatch.strategy=batch",
            "dispatch.max_live_runtimes=32",
            "dispatch.max_parallel=32",
            "dispatch.p_run=96",
        ],
    )
    with pytest.raises(ConfigError, match=r"dispatch\.p_run \(96\)"):
        load_config(None, ["dispatch.max_live_runtimes=95"])
    load_config(None, ["dispatch.max_live_runtimes=96"])
    with pytest.raises(ConfigError, match=r"agent\.tool_timeout_s \(31\)"):
        load_config(None, ["agent.rollout_timeout_s=30", "agent.tool_timeout_s=31"])
    load_config(None, ["agent.rollout_timeout_s=30", "agent.tool_timeout_s=30"])
    with pytest.raises(ConfigError, match=r"grading budget \(960 s\)"):
        load_config(None, ["tasks.families=[swe]", "dispatch.reward_timeout_s=959"])
    load_config(None, ["tasks.families=[swe]", "dispatch.reward_timeout_s=960"])
    # families without a grading budget score fast: any reward timeout goes
    load_config(None, ["dispatch.reward_timeout_s=1"])


def test_the_dispatchers_run_deadline_covers_every_engine_request_and_the_last_tool_call() -> None:
    from conveyor.dispatch.config import DispatchSettings

    for path in sorted((REPO / "configs").glob("*.yaml")):
        config = load_config(path).config
        agent = config.agent
        floor = (
            agent.rollout_timeout_s
            + agent.tool_timeout_s
            + agent.max_turns * config.engine.request_timeout_s
        )
        assert DispatchSettings.from_config(config).run_timeout_s > floor, path.name


def test_weight_probe_tolerance_is_a_config_key_and_must_be_positive() -> None:
    assert load_config(None).config.engine.weight_probe_tolerance is None  # by engine dtype
    config = load_config(None, ["engine.weight_probe_tolerance=0.002"]).config
    assert config.engine.weight_probe_tolerance == 0.002
    with pytest.raises(ConfigError, match=r"engine\.weight_probe_tolerance.*greater than 0"):
        load_config(None, ["engine.weight_probe_tolerance=0"])


def test_trainer_train_seed_is_read_as_trainer_seed(tmp_path: Path) -> None:
    # the RL-headroom protocol's contract names the trainer's seed `trainer.train_seed`
    resolved = load_config(None, ["trainer.train_seed=3"])
    assert resolved.config.trainer.seed == 3 and resolved.sources["trainer.seed"] == "--set"
    path = write(tmp_path, "trainer:\n  train_seed: 2\n")
    assert load_config(path).config.trainer.seed == 2
    assert load_config(path, ["trainer.train_seed=5"]).config.trainer.seed == 5
    both = write(tmp_path, "trainer:\n  train_seed: 2\n  seed: 1\n", "both.yaml")
    with pytest.raises(
        ConfigError, match=r"'trainer\.train_seed' and 'trainer\.seed' .* are one key"
    ):
        load_config(both)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("train.steps=3", "rl.steps"),
        ("trainer.train_dtype=bfloat16", "trainer.dtype"),
        # issue 29: a part's options moved under its name
        ("rl.scale_by_std=false", "rl.advantage.options.scale_by_std"),
        ("trainer.loss.kl_coef=0.1", "trainer.loss.options.kl_coef"),
    ],
)
def test_a_renamed_key_names_its_new_name(old: str, new: str) -> None:
    with pytest.raises(ConfigError, match=rf"did you mean '{new}'\?"):
        load_config(None, [old])


# Issue 29: the flat `rl` keys moved into one section per concept.
RL_MOVES = {
    "sft_steps": "warm_start.steps",
    "sft_tasks": "warm_start.tasks",
    "sft_batch_size": "warm_start.batch_size",
    "sft_lr": "warm_start.lr",
    "sft_train_last_layers": "warm_start.train_last_layers",
    "warm_start_from": "warm_start.from_run",
    "eval_tasks": "eval.tasks",
    "eval_before_tasks": "eval.before_tasks",
    "eval_every": "eval.every",
    "eval_stop_halfwidth": "eval.stop_halfwidth",
    "eval_min_tasks": "eval.min_tasks",
    "eval_temperature": "eval.temperature",
    "truncated": "groups.truncated",
    "incomplete_group": "groups.incomplete",
    "max_refills": "groups.max_refills",
    "refill_fallback": "groups.refill_fallback",
    "min_partial_size": "groups.min_partial_size",
    "filter_zero_variance_groups": "groups.filter_zero_variance",
    "reward_control": "controls.reward",
    "tensorboard": "logging.tensorboard",
    "wandb": "logging.wandb",
    "checkpoint_every": "checkpoints.every",
    "keep_checkpoints": "checkpoints.keep",
}


@pytest.mark.parametrize(("old", "new"), RL_MOVES.items())
def test_every_moved_rl_key_names_its_new_home_from_a_file_and_from_set(
    tmp_path: Path, old: str, new: str
) -> None:
    path = write(tmp_path, f"rl:\n  {old}: 1\n")
    with pytest.raises(ConfigError, match=rf"unknown config key 'rl\.{old}' .*'rl\.{new}'\?"):
        load_config(path)
    with pytest.raises(ConfigError, match=rf"unknown config key 'rl\.{old}' .*'rl\.{new}'\?"):
        load_config(None, [f"rl.{old}=1"])
    # the new home takes the setting (each is a leaf of its section)
    assert (
        new.rsplit(".", 1)[-1]
        in type(getattr(load_config(None).config.rl, new.split(".")[0])).model_fields
    )


def test_an_old_train_section_key_follows_both_renames() -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'rl\.warm_start\.steps'\?"):
        load_config(None, ["train.sft_steps=8"])


@pytest.mark.parametrize(
    ("text", "new"),
    [
        ("rl:\n  scale_by_std: false\n", "rl.advantage.options.scale_by_std"),
        ("trainer:\n  loss:\n    kl_coef: 0.1\n", "trainer.loss.options.kl_coef"),
        ("rl:\n  advantage: {name: grpo, option: {eps: 0.1}}\n", "rl.advantage.options"),
    ],
)
def test_an_old_part_key_in_a_file_names_its_new_place(tmp_path: Path, text: str, new: str) -> None:
    with pytest.raises(ConfigError, match=rf"did you mean '{re.escape(new)}'\?"):
        load_config(write(tmp_path, text))


def test_a_part_is_a_name_or_name_and_options_and_its_options_are_its_own() -> None:
    plain = load_config(None, ["rl.advantage=rloo", "trainer.loss.options.clip_high=0.28"]).config
    assert (plain.rl.advantage.name, plain.trainer.loss.name) == ("rloo", "ppo_clip")
    assert plain.trainer.loss.options == LossConfig(clip_high=0.28)
    grpo = load_config(None, ["rl.advantage.options.scale_by_std=false"]).config
    assert grpo.rl.advantage.name == "grpo" and not grpo.rl.advantage.options.scale_by_std
    # the config file a run records reads back into the same config
    assert load_config(None).config == ConveyorConfig()
    with pytest.raises(ConfigError, match=r"rl\.advantage\.options\.scale_by_std"):
        load_config(None, ["rl.advantage=rloo", "rl.advantage.options.scale_by_std=false"])
    with pytest.raises(ConfigError, match=r"rl\.advantage\.options\.eps: .*greater than"):
        load_config(None, ["rl.advantage.options.eps=-1.0"])


def test_a_kl_term_without_a_reference_policy_is_refused_at_load() -> None:
    """No loop computes reference logprobs, so `kl_coef` > 0 used to fail at the first training
    step ("no ref_logprobs were given"); it is refused with the key and the fix."""
    with pytest.raises(ConfigError, match=r"trainer\.loss\.options\.kl_coef \(0\.1\).*set it to 0"):
        load_config(REPO / "configs" / "quickstart.yaml", ["trainer.loss.options.kl_coef=0.1"])


class _Unbuildable:
    """A family whose constructor always fails: validation must never build it."""

    name = "unbuildable"
    runtimes = ("simulated",)

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("built during config validation")


class _UnbuildableOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    grade_s: float = 700.0


def test_config_validation_builds_no_family(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = FamilySpec(
        name="unbuildable",
        build=_Unbuildable,
        options=_UnbuildableOptions,
        runtimes=("simulated",),
        reward_budget_s=lambda options: options.grade_s + 1.0,
    )
    monkeypatch.setitem(FAMILIES._parts, "unbuildable", spec)
    families = ["tasks.families=[unbuildable]"]
    config = load_config(None, [*families, "dispatch.reward_timeout_s=900.0"]).config
    assert config.tasks.families == ["unbuildable"]
    # its reward budget comes from its spec and its options, still without building it
    with pytest.raises(ConfigError, match=r"'unbuildable' family's grading budget \(701 s\)"):
        load_config(None, families)
    with pytest.raises(ConfigError, match=r"grading budget \(101 s\)"):
        load_config(
            None,
            [
                *families,
                "tasks.options={unbuildable: {grade_s: 100.0}}",
                "dispatch.reward_timeout_s=50.0",
            ],
        )
    with pytest.raises(ConfigError, match=r"runtime\.kind \('local'\) cannot host"):
        load_config(None, [*families, "dispatch.reward_timeout_s=900.0", "runtime.kind=local"])


def test_weight_sync_keys_reach_the_engines_and_the_replica_servers() -> None:
    from conveyor.engines.factory import vllm_options
    from conveyor.engines.vllm_replicas import server_command
    from conveyor.engines.weight_group import WORKER_EXTENSION

    assert load_config(None).config.engine.weight_sync == "auto"
    config = load_config(
        None, ["engine.weight_sync=collective", "engine.weight_bucket_mb=64"]
    ).config
    options = vllm_options(config)
    assert (options["weight_sync"], options["weight_bucket_mb"]) == ("collective", 64)
    common: dict[str, Any] = {
        "max_num_seqs": 4,
        "max_model_len": 512,
        "dtype": "float32",
        "seed": 0,
        "gpu_memory_utilization": 0.5,
        "extra_args": [],
    }
    # replica servers get the worker extension unless the fallback is asked for
    assert WORKER_EXTENSION in server_command(Path("m"), 1, weight_sync="auto", **common)
    assert WORKER_EXTENSION not in server_command(Path("m"), 1, weight_sync="safetensors", **common)
    with pytest.raises(ConfigError, match=r"engine\.weight_sync"):
        load_config(None, ["engine.weight_sync=nccl"])
    with pytest.raises(ConfigError, match=r"engine\.weight_bucket_mb.*greater than 0"):
        load_config(None, ["engine.weight_bucket_mb=0"])
