"""Run under torchrun by tests/trainer/test_engines.py: `rw train` with train.engine=deepspeed on two processes.

Argv: MODE RUN_DIR [overrides...]
  straight  train to the end, then each rank pickles its state to RUN_DIR/state.RANK.pkl
  cut       train to step 2 (checkpointed), run one more step that is never checkpointed, and stop
            there, as if killed
  resume    continue RUN_DIR from its latest checkpoint, then pickle the states
"""

import pickle
import sys
from pathlib import Path

import torch

from rwcore.trainer.config import load_config
from rwcore.trainer.trainer import Trainer


def write_state(trainer: Trainer, run: Path) -> None:
    """What must be the same on every rank: the model and the method (sampler, pool, window, RewardWeaver)."""
    method = trainer.method.state_dict()
    state = {
        "model": [p.detach().cpu().numpy() for p in trainer.policy.model.parameters()],
        "sampler": method["sampler"],
        "pool": method["pool"],
        "weaver": method["weaver"],
        "window": method["window"],
        "step": trainer.step,
    }
    (run / f"state.{trainer.rank}.pkl").write_bytes(pickle.dumps(state))


mode, run, overrides = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
if mode == "resume":
    trainer = Trainer.resume(run, quiet=True)
    trainer.setup()
    trainer.train()
    write_state(trainer, run)
else:
    trainer = Trainer(load_config(None, overrides), run, quiet=True)
    trainer.setup()
    if mode == "cut":
        trainer.config.train.steps = 2
        trainer.train()
        trainer._log(trainer.train_step())  # killed after this step, before any checkpoint of it
    else:
        trainer.train()
        write_state(trainer, run)
trainer.cleanup()
torch.distributed.destroy_process_group()
