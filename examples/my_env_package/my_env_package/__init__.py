"""A coffee counter: a task family of its own, trained with `rw train` without forking rwcore.

Install it (`pip install examples/my_env_package`) and train:

    rw train env.name=coffee                                  # by its entry-point name (pyproject.toml)
    rw train env.name=my_env_package:make_env                 # by module:factory (installed or on PYTHONPATH)
    rw train env.name=coffee train.method=arise env.options.num_train=64

`make_env(**env.options)` is the factory: it gets `env.options` as keyword arguments and returns the
environment (`CoffeeEnv`, the simulator of rwcore.trainer.envs.base's protocol) with the optional providers
the methods use under judge.kind=rule: `rules()` (the rubric checks), `reflector()` (Arise) and `attributor()`
(RewardWeaver). It brings no labelled cases, so RewardWeaver admits its rules without the acceptance test
(the run logs a warning and its admission reports say "unvalidated"), and no `guidance_language()`, so the
built-in model starts from random weights (model.init resolves to random: no reading prior is built).

The game (one word per agent turn; see `environment`): a customer orders a coffee, small or large. Some say
the size ("customer wants large coffee"); some do not ("customer wants coffee") and say it when asked. The
agent may `ask`, then serves with `small` or `large`, or gives up with `end`. Success: the size the customer
wanted is served. Reward 1.0 on success, else 0.0.
"""

from my_env_package.environment import CoffeeEnv, make_env

__all__ = ["CoffeeEnv", "make_env"]
