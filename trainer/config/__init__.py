"""Typed configuration for `rw train`: dataclass sections, YAML files and dotted overrides.

A configuration is a `Config` made of one dataclass per section (`env`, `model`, `prior`, `rollout`,
`optim`, `loss`, `advantage`, `sampler`, `pool`, `rewardweaver`, `judge`, `train`). Every field
has a default, so `Config()` is the embedded default run. Values come, in increasing precedence,
from the defaults, a YAML file nested by section, and `section.key=value` overrides::

    cfg = load_config("my.yaml", ["train.steps=20", "pool.skills=off", "model.name=null"])

Every problem raises `ValueError` naming the full dotted key. Secrets are never part of a configuration:
`JudgeConfig.api_key_env` is the NAME of the environment variable that holds the key.

Modules: `schema` (the sections; the loss and method keys come from `LossSettings` and `MethodSettings`, where
each is declared once), `coercion` (values against declared types), `yaml_input` (reading config files and YAML
with their bounds), `loader` (defaults, file, overrides), `checks` (the rules that span keys), `output` (dicts, YAML,
`describe_config` and docs/configs.md's reference).
"""

from rwcore.trainer.config.checks import resolve_variant
from rwcore.trainer.config.loader import config_from_dict, load_config
from rwcore.trainer.config.output import config_markdown, config_to_dict, describe_config, dump_config, save_config
from rwcore.trainer.config.schema import (
    VARIANT_NAMES,
    AdvantageConfig,
    Config,
    EnvConfig,
    JudgeConfig,
    LoraConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    PoolConfig,
    PriorConfig,
    RewardWeaverConfig,
    RolloutConfig,
    SamplerConfig,
    TrainConfig,
    declared_settings,
    loss_settings,
    method_keys,
    rollout_correction,
)
from rwcore.trainer.config.yaml_input import (
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    MAX_INT_DIGITS,
    MAX_KEY_PARTS,
    MAX_YAML_VALUES,
    read_config_text,
    read_yaml_file,
)

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_KEY_PARTS",
    "MAX_YAML_VALUES",
    "VARIANT_NAMES",
    "AdvantageConfig",
    "Config",
    "EnvConfig",
    "JudgeConfig",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "PoolConfig",
    "PriorConfig",
    "RewardWeaverConfig",
    "RolloutConfig",
    "SamplerConfig",
    "TrainConfig",
    "config_from_dict",
    "config_markdown",
    "config_to_dict",
    "declared_settings",
    "describe_config",
    "dump_config",
    "load_config",
    "loss_settings",
    "method_keys",
    "read_config_text",
    "read_yaml_file",
    "resolve_variant",
    "rollout_correction",
    "save_config",
]
