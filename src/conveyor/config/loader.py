"""Typed configuration: pydantic models, YAML files and dotted ``--set`` overrides.

A run is configured by one :class:`ConveyorConfig`. It comes from three layers, later ones winning:
the defaults declared here, an optional YAML file, and ``--set dotted.key=value`` overrides.
:func:`load_config` resolves them and remembers where every value came from, so
``conveyor config show`` can say why a setting has the value it has.

The sections are in `sections.py` and `training.py`, the whole tree in `schema.py`; this module
reads files and overrides. A key in the wrong section is answered with the section(s) where that
name lives. Anything unexpected (an unknown key, a wrong type, a key given twice in a file) is a
:class:`ConfigError` that names the key, the bad value and where it came from.
"""

import difflib
import json
import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from conveyor.config.base import ConfigError, PartChoice
from conveyor.config.schema import ConveyorConfig
from conveyor.config.training import LossConfig

__all__ = ["ResolvedConfig", "config_to_yaml", "format_config", "load_config"]


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
    if _is_part(field) or _is_kind_options(field):
        return None  # one key: a name, or {name, options} the part's own model checks
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _is_part(field: FieldInfo) -> bool:
    annotation = field.annotation
    return isinstance(annotation, type) and issubclass(annotation, PartChoice)


def _is_kind_options(field: FieldInfo) -> bool:
    """`engine.options`, `runtime.options`: a mapping the options model of the part the
    section's `kind` names checks, so one key here, whatever that model's fields."""
    return field.annotation is BaseModel


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


# Keys renamed when the config became one class per concept (issue 15): an old config is told
# the new name instead of a near miss ('train' is nearer to 'trainer' than to 'rl').
RENAMED: dict[str, str] = {
    "train": "rl",
    "trainer.train_dtype": "trainer.dtype",
    "trainer.train_device": "trainer.device",
    "trainer.adam_betas": "trainer.betas",
    "trainer.adam_eps": "trainer.eps",
    "trainer.lr_schedule": "trainer.schedule",
    "trainer.lora.use_lora": "trainer.lora.enabled",
    "trainer.lora.lora_rank": "trainer.lora.r",
    "trainer.lora.lora_alpha": "trainer.lora.alpha",
    "trainer.lora.lora_dropout": "trainer.lora.dropout",
    "trainer.lora.lora_target_modules": "trainer.lora.target_modules",
    # `rl` became one section per concept (issue 29): its flat keys name their new home.
    "rl.sft_steps": "rl.warm_start.steps",
    "rl.sft_tasks": "rl.warm_start.tasks",
    "rl.sft_batch_size": "rl.warm_start.batch_size",
    "rl.sft_lr": "rl.warm_start.lr",
    "rl.sft_train_last_layers": "rl.warm_start.train_last_layers",
    "rl.warm_start_from": "rl.warm_start.from_run",
    "rl.eval_tasks": "rl.eval.tasks",
    "rl.eval_before_tasks": "rl.eval.before_tasks",
    "rl.eval_every": "rl.eval.every",
    "rl.eval_stop_halfwidth": "rl.eval.stop_halfwidth",
    "rl.eval_min_tasks": "rl.eval.min_tasks",
    "rl.eval_temperature": "rl.eval.temperature",
    "rl.truncated": "rl.groups.truncated",
    "rl.incomplete_group": "rl.groups.incomplete",
    "rl.max_refills": "rl.groups.max_refills",
    "rl.refill_fallback": "rl.groups.refill_fallback",
    "rl.min_partial_size": "rl.groups.min_partial_size",
    "rl.filter_zero_variance_groups": "rl.groups.filter_zero_variance",
    "rl.reward_control": "rl.controls.reward",
    "rl.tensorboard": "rl.logging.tensorboard",
    "rl.wandb": "rl.logging.wandb",
    "rl.checkpoint_every": "rl.checkpoints.every",
    "rl.keep_checkpoints": "rl.checkpoints.keep",
    # Issue 29: a part's options live with the part's name.
    "rl.scale_by_std": "rl.advantage.options.scale_by_std",
    **{f"trainer.loss.{key}": f"trainer.loss.options.{key}" for key in LossConfig.model_fields},
}


# Other names a key is read by (same section). `trainer.train_seed` is the name the RL-headroom
# protocol's contract gives the trainer's seed (issue 19: `--set trainer.train_seed=S`).
ALIASES: dict[str, str] = {"trainer.train_seed": "trainer.seed"}


def _suggest(key: str) -> str | None:
    """The valid key nearest to an unknown dotted key, if any is near enough."""
    renamed = key
    for old, new in RENAMED.items():  # in order, so `train.sft_steps` follows both renames
        if renamed == old or renamed.startswith(f"{old}."):
            renamed = new + renamed[len(old) :]
    if renamed != key:
        return renamed
    name = key.rsplit(".", 1)[-1]
    # A right name in the wrong section: every section that has it (`dtype`: engine and trainer).
    homes = [valid for valid in [*_LEAVES, *_SECTIONS] if valid.rsplit(".", 1)[-1] == name]
    if homes:
        return "' or '".join(homes)
    close = difflib.get_close_matches(key, [*_LEAVES, *_SECTIONS], n=1, cutoff=0.6)
    if close:
        return close[0]
    names = {leaf.rsplit(".", 1)[-1] for leaf in _LEAVES}
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    if not close:
        return None
    return "' or '".join(leaf for leaf in _LEAVES if leaf.rsplit(".", 1)[-1] == close[0])


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
# YAML 1.1 (PyYAML) reads `1e-4` and `2E5` as text: its floats need a dot and a signed
# exponent. Learning rates are written that way (`--set trainer.lr=1e-4`), so numbers in the
# YAML 1.2 form are floats here too (the class keeps its own copy of the resolvers).
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
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
        if key in ALIASES:
            real = ALIASES[key].rsplit(".", 1)[-1]
            if real in data:
                raise ConfigError(
                    f"config keys '{key}' and '{ALIASES[key]}' (from {source}) are one key; "
                    "give it once."
                )
            data[real] = data.pop(name)
            name, key = real, ALIASES[key]
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
    key = ALIASES.get(key.strip(), key.strip())
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
            if _is_part(field) and parts[depth + 1] in ("name", "options"):
                # `--set trainer.loss.options.kl_coef=0.1`: one option of a named part.
                _set_part_option(target, name, parts[depth + 1 :], text, override)
                sources[".".join(parts[: depth + 1])] = source
                return
            if _is_kind_options(field):
                # `--set engine.options.port=9000`: one option of the part `kind` names.
                _set_part_option(
                    target, name, parts[depth + 1 :], text, override, options_only=True
                )
                sources[".".join(parts[: depth + 1])] = source
                return
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


def _set_part_option(
    target: dict[str, Any],
    name: str,
    path: list[str],
    text: str,
    override: str,
    *,
    options_only: bool = False,
) -> None:
    """Set `path` (``name`` or ``options.<key>...``; with `options_only`, an options mapping's own
    ``<key>...``) inside the part key `name` of `target`, keeping what the file gave it (a plain
    name becomes ``{name: ...}``)."""
    current = target.get(name)
    part: dict[str, Any] = (
        {"name": current} if isinstance(current, str) and not options_only else dict(current or {})
    )
    target[name] = part
    inner = part
    for step in path[:-1]:
        nested = inner.get(step)
        inner[step] = nested = dict(nested) if isinstance(nested, dict) else {}
        inner = nested
    try:
        value = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"the value of override '{override}' is not valid YAML: {_yaml_problem(exc)}."
        ) from None
    inner[path[-1]] = value


def _describe(field: FieldInfo) -> str:
    if _is_part(field):
        return "a registered name, or {name, options} checked by that part's options model"
    if _is_kind_options(field):
        return "a mapping checked by the options model of the part the section's kind names"
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
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


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
