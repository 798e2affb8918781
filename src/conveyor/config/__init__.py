"""Typed configuration: one pydantic model per concept, YAML files and dotted ``--set`` overrides.

`load_config(path, overrides)` resolves defaults, a file and overrides into a `ResolvedConfig`
that remembers where each value came from. The sections are the settings the parts themselves
take (the trainer takes `TrainerConfig`, the loss `LossConfig`): there is one class per concept.
Names of pluggable parts are checked against `conveyor.registry`.
"""

from conveyor.config.base import ConfigError, PartChoice
from conveyor.config.cluster import ClusterConfig
from conveyor.config.loader import ResolvedConfig, config_to_yaml, format_config, load_config
from conveyor.config.schema import ConveyorConfig
from conveyor.config.sections import (
    AgentConfig,
    DispatchConfig,
    EngineConfig,
    HintsConfig,
    ModelConfig,
    RunConfig,
    RuntimeConfig,
    SamplingConfig,
    TasksConfig,
)
from conveyor.config.training import LoraConfig, LossConfig, RLConfig, TrainerConfig

__all__ = [
    "AgentConfig",
    "ClusterConfig",
    "ConfigError",
    "ConveyorConfig",
    "DispatchConfig",
    "EngineConfig",
    "HintsConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "PartChoice",
    "RLConfig",
    "ResolvedConfig",
    "RunConfig",
    "RuntimeConfig",
    "SamplingConfig",
    "TasksConfig",
    "TrainerConfig",
    "config_to_yaml",
    "format_config",
    "load_config",
]
