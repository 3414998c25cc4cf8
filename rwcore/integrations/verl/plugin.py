"""What verl's plugin discovery loads (`verl.plugins` entry point "rwcore", declared in pyproject.toml).

`import verl` loads every `verl.plugins` entry point in every process (verl/__init__.py; set
VERL_USE_EXTERNAL_PLUGINS=none to stop it), so once rwcore is installed the loss, the estimator and
the V1 trainer mode are known to verl without any config line. `load()` registers the loss and the
estimator (cheap: verl's core_algos; with them verl's bypass mode keeps rwcore's loss, see
`registration.install_bypass_mode_keeping`), and registers the V1 trainer when verl.trainer.ppo.v1 gets
imported (it pulls in Ray and TransferQueue, which only the task runner needs): a post-import hook,
because verl looks the trainer up in the same module that defines the registry.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

_V1 = "verl.trainer.ppo.v1"


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds verl.trainer.ppo.v1 through the normal finders and registers rwcore's trainer after it runs."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _V1:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            try:
                from .trainer_v1 import trainer_class

                trainer_class()
            except Exception as error:  # keep verl usable; the trainer lookup will name the mode
                warnings.warn(f"rwcore could not register verl trainer mode 'rwcore_sync': {error!r}", stacklevel=2)

        loader.exec_module = exec_module
        return spec


def load() -> None:
    """Registers "rwcore_filtered_dual_clip" and "rwcore_arise" now, "rwcore_sync" when verl's V1 trainer loads."""
    from .registration import register

    register(forward_non_tensor_batch=False)
    if _V1 in sys.modules:
        from .trainer_v1 import trainer_class

        trainer_class()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())


# verl's discovery only imports the entry point (`EntryPoint.load()`), so the module does the work.
load()
