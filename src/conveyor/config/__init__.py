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
from conveyor.config.training import (
    CheckpointsConfig,
    ControlsConfig,
    EvalConfig,
    GroupsConfig,
    LoggingConfig,
    LoraConfig,
    LossConfig,
    RLConfig,
    TrainerConfig,
    WarmStartConfig,
)

__all__ = [
    "AgentConfig",
    "CheckpointsConfig",
    "ClusterConfig",
    "ConfigError",
    "ControlsConfig",
    "ConveyorConfig",
    "DispatchConfig",
    "EngineConfig",
    "EvalConfig",
    "GroupsConfig",
    "HintsConfig",
    "LoggingConfig",
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
    "WarmStartConfig",
    "config_to_yaml",
    "format_config",
    "load_config",
]
