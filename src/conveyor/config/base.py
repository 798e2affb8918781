"""The base of every config section, and the error every bad config raises."""

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from conveyor.registry import ADVANTAGES, BACKENDS, ENGINES, EXECUTORS, STRATEGIES

# Text fields that must name a registered part: the registries own the names, so one a plugin
# registers is as valid as a built-in one, and a wrong one is answered with the known names.
StrategyName = Annotated[str, AfterValidator(STRATEGIES.check)]
ExecutorName = Annotated[str, AfterValidator(EXECUTORS.check)]
EngineKind = Annotated[str, AfterValidator(ENGINES.check)]
AdvantageName = Annotated[str, AfterValidator(ADVANTAGES.check)]
BackendName = Annotated[str, AfterValidator(BACKENDS.check)]


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key, the value and its source."""


class Section(BaseModel):
    """A config section: strict, frozen, no unknown keys."""

    # Strict: YAML already gives typed values, so "8" for an int or 1 for a bool is a mistake to
    # report, not to coerce. Frozen: after resolution the recorded sources must stay true.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
