"""verl's legacy trainer with rwcore: registration, verdicts and the curriculum sampler without plugins or V1.

verl 0.8.0 loads no `verl.plugins` entry points and has no V1 trainer registry (no `trainer.v1`,
no `rwcore_sync`); its trainer (`python -m verl.trainer.main_ppo`, RayPPOTrainer) offers two hooks:
`run_ppo(config, task_runner_class=...)` and the `train_sampler` its `TaskRunner.run` builds with
`create_rl_sampler(config.data, train_dataset)` and hands to `RayPPOTrainer`. verl 0.9's legacy
trainer (`trainer.use_v1=false`, `verl.trainer.main_ppo_v0`) has the same two. `task_runner_class()`
is verl's legacy `TaskRunner` whose `run(config)`, in the task-runner process (where RayPPOTrainer's
fit loop calls `compute_advantage`):

- checks the configuration before anything is built (`check_v1_config`: the loss's clip keys and
  `data.rwcore_sampler`'s needs, each error naming the key);
- calls `register()`: the loss and estimator in verl's registries and `compute_advantage`'s
  forwarding of `non_tensor_batch` to `rwcore_arise` / `rwcore_method`;
- with `data.rwcore_sampler` set, makes `create_rl_sampler` return `RwcoreCurriculumSampler` (verl's
  `StatefulDataLoader` saves it in data.pt) and feeds it each step's batch right after `rwcore_arise`
  computed its advantages (`registration.set_after_arise`).

The actor workers (other processes) look the loss up by name: on verl 0.8 they register it through
`actor_rollout_ref.model.external_lib=rwcore.integrations.verl.autoregister` (verl imports that module in each
worker; importing the package into a process that has verl registers).

    python -m rwcore.integrations.verl.legacy <verl's Hydra overrides>     # docs/integrations.md
"""

from __future__ import annotations

import functools
import importlib.util

from .config import _require
from .registration import register, set_after_arise


def legacy_module():
    """The module that holds verl's legacy TaskRunner: verl.trainer.main_ppo_v0 (0.9), else
    verl.trainer.main_ppo (0.8)."""
    _require("verl")
    name = (
        "verl.trainer.main_ppo_v0" if importlib.util.find_spec("verl.trainer.main_ppo_v0") else "verl.trainer.main_ppo"
    )
    return _require(name)


@functools.cache
def task_runner_class() -> type:
    """verl's legacy `TaskRunner` (a plain class, Ray's wrapper removed) with rwcore's start checks and hooks."""
    module = legacy_module()
    base = getattr(module.TaskRunner, "__ray_actor_class__", module.TaskRunner)  # 0.9 wraps it in @ray.remote

    class RwcoreTaskRunner(base):
        """verl's legacy task runner; rubric verdicts reach "rwcore_arise", `data.rwcore_sampler` drives the loader."""

        def run(self, config):
            from .sampler import sampler_class
            from .trainer_v1 import check_v1_config, sampler_data_config

            settings = check_v1_config(config)
            register()
            if not settings:
                return super().run(config)
            original = module.create_rl_sampler

            def create_rl_sampler(data_config, dataset):
                sampler = sampler_class()(dataset, sampler_data_config(config, settings))
                set_after_arise(sampler.update)  # fed right after each "rwcore_arise" step
                return sampler

            module.create_rl_sampler = create_rl_sampler
            try:
                return super().run(config)
            finally:
                module.create_rl_sampler = original
                set_after_arise(None)

    RwcoreTaskRunner.__module__ = __name__
    RwcoreTaskRunner.__qualname__ = "RwcoreTaskRunner"
    return RwcoreTaskRunner


def __getattr__(name: str):
    # Ray pickles the task runner by reference: a fresh process finds it here.
    if name == "RwcoreTaskRunner":
        return task_runner_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """`python -m verl.trainer.main_ppo`, with `RwcoreTaskRunner` as the task runner (same Hydra config)."""
    import os

    import hydra
    import ray

    main_ppo = _require("verl.trainer.main_ppo")
    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")

    @hydra.main(config_path=config_dir, config_name="ppo_trainer", version_base=None)
    def _main(config):
        from verl.utils.device import auto_set_device

        auto_set_device(config)
        migrate = getattr(main_ppo, "migrate_legacy_reward_impl", None)  # verl 0.8's main() does it
        if migrate is not None:
            config = migrate(config)
        main_ppo.run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(task_runner_class()))

    _main()


if __name__ == "__main__":
    # `python -m` runs this file as __main__: use the package's module, whose RwcoreTaskRunner is the one Ray
    # pickles by reference.
    from rwcore.integrations.verl.legacy import main as _package_main

    _package_main()
