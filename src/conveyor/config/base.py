"""The base of every config section, the error every bad config raises, and how a section names
a pluggable part (`PartChoice`: a registered name and its options)."""

import difflib
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
)

from conveyor.registry import ENGINES, NoOptions, PartSpec, Registry

# Text fields that must name a registered part: the registries own the names, so one a plugin
# registers is as valid as a built-in one, and a wrong one is answered with the known names.
EngineKind = Annotated[str, AfterValidator(ENGINES.check)]


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key, the value and its source."""


class Section(BaseModel):
    """A config section: strict, frozen, no unknown keys."""

    # Strict: YAML already gives typed values, so "8" for an int or 1 for a bool is a mistake to
    # report, not to coerce. Frozen: after resolution the recorded sources must stay true.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PartChoice(BaseModel):
    """A part a config key names: its registered `name` and its `options`, an instance of the
    part's own options model (so a plugin's part gets typed options from YAML like a built-in).

    In YAML it is ``{name: grpo, options: {scale_by_std: false}}``, or the name alone
    (``grpo``) for the part's default options.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The registered name of the part.")
    options: SerializeAsAny[BaseModel] = Field(
        default_factory=NoOptions, description="The part's options, checked by its own model."
    )

    def __str__(self) -> str:
        return self.name


def _choose(registry: Registry[Any], key: str, default: str, value: Any) -> PartChoice:
    """`value` (a name, or a mapping of `name` and `options`; no name: `default`) as a checked
    `PartChoice`; a `ValueError` naming the key of whatever is wrong."""
    if isinstance(value, PartChoice):
        value = {"name": value.name, "options": value.options}
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        raise ValueError(
            f"{key} names a {registry.kind}: a name, or a mapping {{name, options}}; got {value!r}"
        )
    stray = sorted(str(k) for k in set(value) - {"name", "options"})
    if stray:
        # `trainer.loss: {kl_coef: 0.1}` (the options without their name) or a misspelled key.
        near = [difflib.get_close_matches(k, ["name", "options"], n=1, cutoff=0.6) for k in stray]
        hints = [
            f"'{key}.{close[0]}'" if close else f"'{key}.options.{name}'"
            for name, close in zip(stray, near, strict=True)
        ]
        raise ValueError(
            f"{key} takes 'name' and 'options', not {', '.join(repr(k) for k in stray)}; "
            f"did you mean {' and '.join(hints)}?"
        )
    name = value.get("name", default)
    if not isinstance(name, str):
        raise ValueError(f"{key}.name must name a {registry.kind}, got {name!r}")
    registry.check(name)
    spec: PartSpec = registry.spec(name)
    options = spec.validate_options(value.get("options"), f"{key}.options")
    return PartChoice(name=name, options=options)


def chooser(registry: Registry[Any], key: str, default: str) -> Callable[[Any], PartChoice]:
    """The validator of a config field naming a part of `registry` at `key` (e.g.
    `rl.advantage`): ``Annotated[PartChoice, BeforeValidator(chooser(ADVANTAGES, key))]``
    holds a registered name and the options its part's own model validated; a mapping without
    `name` names `default`."""
    return lambda value: _choose(registry, key, default, value)


def default_part(registry: Registry[Any], key: str, name: str) -> Callable[[], PartChoice]:
    """A default factory: the part `name` with its default options."""
    return lambda: _choose(registry, key, name, name)


def kind_options(
    data: Any, registry: Registry[Any], section: str, default: str, *, open_value: str | None = None
) -> Any:
    """A section's raw mapping (`engine`, `runtime`) with its `options` checked by the options
    model of the part its `kind` names (`default` when unset): the section holds that model's
    instance, so the part reads typed options. A kind that is not registered is left to the
    kind's own check (its options are dropped, so only the kind is reported); `open_value`
    (`auto`) names no part, so it takes no options."""
    if not isinstance(data, dict):
        return data
    kind = data.get("kind", default)
    raw = data.get("options")
    if kind == open_value and open_value is not None:
        if raw:
            raise ValueError(
                f"{section}.options configures the part {section}.kind names, and "
                f"{section}.kind {open_value!r} names none; set {section}.kind too"
            )
        return {**data, "options": NoOptions()}
    if not isinstance(kind, str) or kind not in registry:
        return {key: value for key, value in data.items() if key != "options"}
    if raw is not None and not isinstance(raw, dict | BaseModel):
        raise ValueError(f"{section}.options must be a mapping of the part's options, got {raw!r}")
    spec: PartSpec = registry.spec(kind)
    return {**data, "options": spec.validate_options(raw, f"{section}.options")}
