"""The base of every config section, and the error every bad config raises."""

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key, the value and its source."""


class Section(BaseModel):
    """A config section: strict, frozen, no unknown keys."""

    # Strict: YAML already gives typed values, so "8" for an int or 1 for a bool is a mistake to
    # report, not to coerce. Frozen: after resolution the recorded sources must stay true.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
