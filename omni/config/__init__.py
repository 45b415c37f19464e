"""Stage configs: the schema (frozen dataclasses), raw loading and validation. Torch-free."""

from omni.config.load import DEFAULT_MAX_MODEL_LEN, config_for_model, load_config
from omni.config.schema import (
    STAGE_CONFIG_DIR,
    EngineConfig,
    OmniConfig,
    ResourcesConfig,
    RuntimeConfig,
    StageConfig,
    StreamConfig,
)
from omni.config.validate import ConfigError, check_resources

__all__ = [
    "DEFAULT_MAX_MODEL_LEN",
    "STAGE_CONFIG_DIR",
    "ConfigError",
    "EngineConfig",
    "OmniConfig",
    "ResourcesConfig",
    "RuntimeConfig",
    "StageConfig",
    "StreamConfig",
    "check_resources",
    "config_for_model",
    "load_config",
]
