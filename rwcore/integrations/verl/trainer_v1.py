"""verl 0.9's V1 trainer with rwcore: verdicts reach the estimator, the curriculum sampler drives the loader.

verl 0.9's V1 `_compute_advantage` fetches a fixed set of fields from TransferQueue ("uid",
"response_mask", "rm_scores", ...) and calls the estimator without `non_tensor_batch`, and its
`create_rl_sampler` knows only random / sequential sampling. Its supported extension point is the
trainer registry (`verl.trainer.ppo.v1.register_trainer`, chosen by `trainer.v1.trainer_mode`), so
`trainer_class()` registers `PPOTrainerSync`'s subclass "rwcore_sync" that

- at start (`__init__`) checks the configuration and raises naming the key to set;
- in `_init_dataloader` replaces the loader's sampler with `RwcoreCurriculumSampler` when
  `data.rwcore_sampler` is set (verl's `StatefulDataLoader` then saves the sampler's state in verl's
  data.pt checkpoint and restores it on resume);
- in `on_step_end`, after verl's weight sync, ends the step of an `AdaptiveMethodDriver` ("rwcore_method":
  the pool update and RewardWeaver's stage, whose diagnosis then rolls out the updated policy);
- in `_compute_advantage` fetches the verdicts (and, with the sampler, the task ids) of the batch from
  TransferQueue by the same keys verl uses, runs verl's own `_compute_advantage` with them in scope
  (`verdicts_in_scope`), then feeds the sampler.

Configuration (docs/integrations.md):

    trainer.v1.trainer_mode=rwcore_sync
    algorithm.adv_estimator=rwcore_arise
    +data.rwcore_sampler.rubrics={cites-order-id: Verification}     # optional: the curriculum sampler
    data.dataloader_num_workers=0                                    # required with the sampler
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import numpy as np

from .advantage import _arise_settings, verdicts_in_scope
from .config import ADV_ESTIMATOR_NAME, POLICY_LOSS_NAME, UID_KEY, _get, _plain, _require
from .loss import loss_params_from_config

TRAINER_MODE = "rwcore_sync"
SAMPLER_KEY = "rwcore_sampler"  # data.rwcore_sampler: RwcoreCurriculumSampler's settings (its data.sampler)


def _select(config, dotted: str, default=None):
    node = config
    for part in dotted.split("."):
        node = _get(node, part, None)
        if node is None:
            return default
    return node


def check_v1_config(config) -> dict:
    """Checks a verl 0.9 PPO config for the rwcore pieces it names; returns the sampler settings (or {}).

    Raises ValueError naming the key to set when: the rwcore loss is chosen with dual clip disabled or
    an empty filter (actor_rollout_ref.actor.clip_ratio_*); the sampler is set without the rwcore_arise
    estimator feeding it verdicts (algorithm.adv_estimator / algorithm.rwcore.verdicts_key); the sampler
    is set with data.dataloader_num_workers > 0, or with exact-refill modes that force
    data.gen_batch_size=1 (algorithm.filter_groups.enable, trainer.v1.sampler.sync_refill_failed_groups).
    """
    actor = _select(config, "actor_rollout_ref.actor")
    loss_mode = _select(config, "actor_rollout_ref.actor.policy_loss.loss_mode")
    if loss_mode == POLICY_LOSS_NAME:
        try:
            loss_params_from_config(actor)
        except ValueError as error:
            raise ValueError(f"actor_rollout_ref.actor: {error}") from None
    estimator = _select(config, "algorithm.adv_estimator")
    estimator = getattr(estimator, "value", estimator)
    algorithm = _select(config, "algorithm")
    settings = _arise_settings(algorithm) if estimator == ADV_ESTIMATOR_NAME else None
    sampler = _plain(_select(config, f"data.{SAMPLER_KEY}")) or {}
    if not isinstance(sampler, Mapping):
        raise ValueError(f"data.{SAMPLER_KEY} must be a mapping of RwcoreCurriculumSampler settings")
    if sampler:
        if settings is None:
            raise ValueError(
                f"data.{SAMPLER_KEY} needs the verdicts of algorithm.adv_estimator={ADV_ESTIMATOR_NAME} "
                f"as its feedback; got algorithm.adv_estimator={estimator!r}"
            )
        if settings.verdicts_key is None:
            raise ValueError(
                f"data.{SAMPLER_KEY} gets no feedback with algorithm.rwcore.verdicts_key=null: "
                "set it to the reward extra-info key holding the verdicts"
            )
        if int(_select(config, "data.dataloader_num_workers", 0)) != 0:
            raise ValueError(
                f"data.{SAMPLER_KEY} draws each batch after the previous step's feedback: "
                "set data.dataloader_num_workers=0"
            )
        if bool(_select(config, "algorithm.filter_groups.enable", False)) or bool(
            _select(config, "trainer.v1.sampler.sync_refill_failed_groups", False)
        ):
            raise ValueError(
                f"data.{SAMPLER_KEY} draws whole batches; it cannot serve the one-prompt refills of "
                "algorithm.filter_groups.enable / trainer.v1.sampler.sync_refill_failed_groups"
            )
        group = sampler.get("group_size")
        n = _select(config, "actor_rollout_ref.rollout.n")
        if group is not None and n is not None and int(group) != int(n):
            raise ValueError(f"data.{SAMPLER_KEY}.group_size={group} must equal actor_rollout_ref.rollout.n={n}")
        sampler = dict(sampler)
        if group is None and n is not None:
            sampler["group_size"] = int(n)
    return sampler


def sampler_data_config(config, sampler_settings: Mapping) -> dict:
    """The `data_config` `RwcoreCurriculumSampler` reads: data.rwcore_sampler as its `sampler` section."""
    return {
        "sampler": dict(sampler_settings),
        "train_batch_size": _select(config, "data.train_batch_size"),
        "gen_batch_size": _select(config, "data.gen_batch_size"),
        "seed": _select(config, "data.seed"),
    }


def _column(values, n: int, name: str) -> np.ndarray:
    """A TransferQueue field (NonTensorStack, LinkedList, tensor or array) as an object array of n entries."""
    if hasattr(values, "tolist") and not isinstance(values, np.ndarray):
        values = values.tolist()
    out = np.empty(n, dtype=object)
    items = list(values)
    if len(items) != n:
        raise ValueError(f"TransferQueue field {name!r} has {len(items)} entries for {n} keys")
    out[:] = items
    return out


def fetched_non_tensor(fields: Mapping[str, Any], n: int) -> dict:
    """What `kv_batch_get` returned for the rwcore fields -> a non_tensor_batch of object arrays."""
    return {name: _column(values, n, name) for name, values in fields.items()}


class _Feedback:
    """The minimal `DataProto` face `RwcoreCurriculumSampler.update` reads: `.non_tensor_batch`."""

    def __init__(self, non_tensor_batch: dict) -> None:
        self.non_tensor_batch = non_tensor_batch


def _registered() -> type | None:
    """Our class in verl's trainer registry, if it is there (verl's registry is where it is kept)."""
    import sys

    trainer_base = sys.modules.get("verl.trainer.ppo.v1.trainer_base")
    cls = getattr(trainer_base, "TRAINER_REGISTRY", {}).get(TRAINER_MODE) if trainer_base is not None else None
    return cls if getattr(cls, "__module__", None) == __name__ else None


def trainer_class() -> type:
    """verl's `PPOTrainerSync` subclass with the rwcore hooks, registered as trainer_mode "rwcore_sync" (once)."""
    if _registered() is not None:
        return _registered()
    verl = _require("verl")
    if importlib.util.find_spec("verl.trainer.ppo.v1") is None:  # verl 0.8: no V1 trainer, no trainer registry
        raise RuntimeError(
            f"trainer.v1.trainer_mode=rwcore_sync needs verl's V1 trainer registry (verl.trainer.ppo.v1, verl >= 0.9), "
            f"which verl {getattr(verl, '__version__', '?')} lacks. On this release run the legacy trainer "
            "(python -m verl.trainer.main_ppo) with rwcore.integrations.verl.register() in its task runner "
            "(docs/integrations.md, 'verl 0.8.0')"
        )
    v1 = _require("verl.trainer.ppo.v1")
    if _registered() is not None:  # importing verl.trainer.ppo.v1 just ran rwcore's plugin hook, which built it
        return _registered()
    import transfer_queue as tq
    from verl.trainer.ppo.v1 import trainer_base

    from .sampler import sampler_class

    class RwcorePPOTrainer(v1.PPOTrainerSync):
        """verl's sync V1 trainer; rubric verdicts reach "rwcore_arise", `data.rwcore_sampler` drives the loader."""

        def __init__(self, config, *args, **kwargs) -> None:
            self.rwcore_sampler_settings = check_v1_config(config)
            self.rwcore_sampler = None
            super().__init__(config, *args, **kwargs)

        def _init_dataloader(self):
            super()._init_dataloader()
            if not self.rwcore_sampler_settings:
                return
            from torchdata.stateful_dataloader import StatefulDataLoader
            from verl.utils.dataset.rl_dataset import collate_fn

            self.rwcore_sampler = sampler_class()(
                self.train_dataset, sampler_data_config(self.config, self.rwcore_sampler_settings)
            )
            self.train_dataloader = StatefulDataLoader(
                dataset=self.train_dataset,
                batch_size=self.rwcore_sampler.batch_size,
                num_workers=0,
                drop_last=True,
                collate_fn=collate_fn,
                sampler=self.rwcore_sampler,
            )

        def _rwcore_fields(self) -> list[str]:
            settings = _arise_settings(self.config.algorithm)
            fields = [] if settings.verdicts_key is None else [settings.verdicts_key]
            if self.rwcore_sampler is not None:
                fields += [UID_KEY, self.rwcore_sampler.task_id_key]
            return fields

        def _compute_advantage(self, batch, metrics):
            from .method import METHOD_ESTIMATOR_NAME, registered_driver

            estimator = getattr(self.config.algorithm.adv_estimator, "value", self.config.algorithm.adv_estimator)
            fields = self._rwcore_fields() if estimator == ADV_ESTIMATOR_NAME else []
            driver = registered_driver() if estimator == METHOD_ESTIMATOR_NAME else None
            if driver is not None:
                fields = [driver.verdicts_key, driver.task_id_key]
            if not fields:
                return super()._compute_advantage(batch, metrics)
            fetched = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
            non_tensor = fetched_non_tensor({name: fetched[name] for name in fields}, len(batch.keys))
            with verdicts_in_scope(non_tensor):
                batch = super()._compute_advantage(batch, metrics)
            if self.rwcore_sampler is not None:
                self.rwcore_sampler.update(_Feedback(non_tensor))
                metrics.update({f"rwcore/sampler/{k}": v for k, v in self.rwcore_sampler.last_update.items()})
            return batch

        def on_step_end(self):
            super().on_step_end()  # the rollout replicas now hold the updated weights
            from .method import METHOD_ESTIMATOR_NAME, registered_driver

            estimator = getattr(self.config.algorithm.adv_estimator, "value", self.config.algorithm.adv_estimator)
            driver = registered_driver() if estimator == METHOD_ESTIMATOR_NAME else None
            if driver is not None:  # the end of the method's step: its diagnosis rolls out the updated policy
                driver.end_step()

    RwcorePPOTrainer.__module__ = __name__
    RwcorePPOTrainer.__qualname__ = "RwcorePPOTrainer"
    if TRAINER_MODE not in trainer_base.TRAINER_REGISTRY:
        v1.register_trainer(TRAINER_MODE)(RwcorePPOTrainer)
    else:  # a reload of this module: replace ours
        trainer_base.TRAINER_REGISTRY[TRAINER_MODE] = RwcorePPOTrainer
    return RwcorePPOTrainer
