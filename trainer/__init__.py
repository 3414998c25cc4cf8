"""The thin trainer, environments, rollouts and the `rw` CLI (rwcore.trainer).

`rw train` runs `Trainer` (trainer.py) on a `Config` (config/) over an
environment (envs/); `rw report` renders a run folder's plots (report.py).
It depends on rwcore and rwcore.kernels, never the other way round.
"""
