"""Shared constants and config readers of the verl integration (verl's configs are dicts, DictConfigs or
dataclasses)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping

POLICY_LOSS_NAME = "rwcore_filtered_dual_clip"
ADV_ESTIMATOR_NAME = "rwcore_arise"
TESTED_VERL_VERSIONS = ("0.8.0", "0.9.1")  # run through its real modules (tests); versions.TESTED holds the range

# verl's agg_loss modes (verl/trainer/ppo/core_algos.py; ActorConfig.__post_init__ lists the same).
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# non_tensor_batch keys (all configurable, see RwcoreCurriculumSampler and compute_arise_advantage).
UID_KEY = "uid"  # verl's group id: one uuid per prompt, shared by its rollout.n responses
TASK_ID_KEY = "rwcore_task_id"  # dataset column (or key of the extra_info column): the task id
TAGS_KEY = "rwcore_tags"  # dataset column (or extra_info key): task-type tags; default data_source
VERDICTS_KEY = "rwcore_verdicts"  # reward extra info: per response {rubric id: verdict}
OUTCOME_KEY = "rwcore_outcome"  # reward extra info (optional): per response outcome in [0, 1]


def _get(config, key: str, default=None):
    """`config[key]` for a mapping (dict, DictConfig, verl's BaseConfig), else an attribute; default if absent/None."""
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


def _plain(value):
    """An OmegaConf container as plain Python; anything else unchanged."""
    module = sys.modules.get("omegaconf")
    if module is not None and module.OmegaConf.is_config(value):
        return module.OmegaConf.to_container(value, resolve=True)
    return value


def _require(module_name: str):
    """verl's `module_name`, or ImportError saying `pip install verl`; warns once outside the tested range."""
    from rwcore.integrations.versions import TESTED, check_version

    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(
            f"rwcore.integrations.verl needs verl for this: pip install verl (tested: verl{TESTED['verl'][0]}). "
            f"Import of {module_name} failed: {error}"
        ) from error
    check_version("verl", getattr(sys.modules.get("verl"), "__version__", "unknown"))
    return module
