"""`RunState`: what of a training run goes into a checkpoint, and how a run continues from one.

A checkpoint holds everything an exact resume needs: the engine's model and optimizer, the step, the resolved
config, the process count, the method's state, the LLM roles' cost totals, every process's random generators,
rollouts already requested ahead (rollout.max_lag), the adaptive entropy controller and the LoRA record. The
on-disk format - staging folder, manifest, verification, `latest` - is rwcore.trainer.checkpoint's.

A mixin of `rwcore.trainer.trainer.Trainer`: it reads and restores the trainer's config, out, step, engine,
method, usage, policy, policy_update, rollouts_ahead, rank, world_size and main.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from rwcore._io import atomic_write_bytes
from rwcore.method import AdaptiveMethod
from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer.checkpoint_retention import prune_checkpoints
from rwcore.trainer.config import config_to_dict
from rwcore.trainer.lora import check_checkpoint, checkpoint_record, is_lora, load_checkpoint_state_dict
from rwcore.trainer.resume_overrides import check_extension, resume_config
from rwcore.trainer.run_info import read_run_info
from rwcore.trainer.run_logs import truncate_after
from rwcore.trainer.run_paths import check_run_folder

T = TypeVar("T", bound="RunState")


class RunState:
    """Saving a checkpoint, resuming from one, restoring the trainer's state (mixed into the Trainer)."""

    @classmethod
    def resume(cls: type[T], run_dir: str | os.PathLike, quiet: bool = False, overrides: Sequence[str] = ()) -> T:
        """A trainer that continues the run in `run_dir` from its newest intact checkpoint: each
        `checkpoints/step_N` is verified against its manifest, newest first; one skipped for damage is
        named on stderr with the reason. Raises ValueError naming the run folder when none is intact.

        overrides: the `key=value` settings a resumed run may change (rwcore.trainer.resume_overrides:
        train.steps to extend it, the cadences); any other key is a ValueError naming it, before anything is
        written. The trainer's `resumed` says which checkpoint it continues from and the steps before and after."""
        run = Path(run_dir)
        check_run_folder(run)  # before anything is written: nothing inside it is written through a link
        read_run_info(run)  # a damaged record of the earlier invocations is refused before anything is written
        candidates = ckpt.step_folders(run / "checkpoints")
        if not candidates:
            raise ValueError(f"--resume: {run} has no checkpoint (no checkpoints/step_* folder)")
        # the saved config with the settings a resumed run may change: anything else refused before a checkpoint is read
        config, steps_before = resume_config(run / "config.yaml", overrides)
        skipped = []
        for path in candidates:
            try:
                manifest = ckpt.verify(path)
            except ckpt.CheckpointError as error:
                skipped.append((path, error))
                continue
            if skipped and os.environ.get("RANK", "0") == "0":
                for bad, error in skipped:
                    print(
                        f"rw: checkpoint {bad.name} skipped ({error}); resuming from {path.name}",
                        file=sys.stderr,
                        flush=True,
                    )
            done = int(manifest["step"])
            check_extension(config, steps_before, done)
            trainer = cls(config, run, quiet)
            trainer._resume_from = path
            trainer._verified = path
            trainer.resumed = {"checkpoint": str(path), "step": done, "steps_before": steps_before}
            return trainer
        reasons = "; ".join(f"{path.name}: {error}" for path, error in skipped)
        raise ValueError(f"no intact checkpoint in {run} ({reasons})")

    def save_checkpoint(self) -> Path:
        """Everything an exact resume needs, written to a temporary folder and renamed into place.

        Every file is fsynced, then manifest.json (size and sha256 of each file) is written last and the
        folders are fsynced before the rename; the checkpoints folder is fsynced after it. A write that
        fails (disk full, ...) removes the temporary folder and raises RunFolderError naming the
        checkpoint; the previous checkpoint and `latest` are left as they were."""
        folder = self.out / "checkpoints"
        name = f"step_{self.step:06d}"
        staging = folder / f".{name}.tmp"
        target = folder / name
        try:
            with ckpt.writing(target):
                if self.main:
                    shutil.rmtree(staging, ignore_errors=True)
                    staging.mkdir(parents=True)
                self.engine.barrier()
                self.engine.save(staging)  # collective under DeepSpeed
                rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
                if self.main:
                    ckpt.save(
                        {
                            "step": self.step,
                            "config": config_to_dict(self.config),
                            "world_size": self.world_size,
                            "method": self.method.state_dict(),
                            "usage_totals": self.usage.state_dict(),
                            "rng": rng,
                            # rollout.max_lag > 0: rollouts already requested from older versions, trained on next
                            "rollouts_ahead": self.rollouts_ahead.state_dict()
                            if self.rollouts_ahead is not None
                            else {},
                            # loss.adaptive_entropy: the coefficient and the last measured entropy
                            **(
                                {"entropy_control": self.policy_update.entropy_control.state_dict()}
                                if self.config.loss.adaptive_entropy
                                else {}
                            ),
                            # model.lora: the adapter settings and the digest of the base they were trained on
                            **(
                                {"lora": checkpoint_record(self.policy.model, self.config.model.lora)}
                                if is_lora(self.policy.model)
                                else {}
                            ),
                        },
                        staging / "state.pt",
                    )
                else:
                    ckpt.save(rng, staging / f"rng_rank{self.rank}.pt")
                self.engine.barrier()
                if self.main:
                    ckpt.write_manifest(staging, self.step)  # fsyncs every file, the manifest and the folders
                    if target.is_symlink():  # a link skipped on resume: the link goes, never what it points to
                        target.unlink()
                    shutil.rmtree(target, ignore_errors=True)
                    os.replace(staging, target)
                    ckpt.fsync_dir(folder)
                    atomic_write_bytes(folder / "latest", name.encode())
        except BaseException as error:
            if self.main:
                shutil.rmtree(staging, ignore_errors=True)  # never a half-written folder left behind
            if isinstance(error, ckpt.RunFolderError):
                earlier = [p for p in ckpt.step_folders(folder) if not p.is_symlink()] if folder.is_dir() else []
                kept = (
                    f"the latest checkpoint, {earlier[0].name}, is intact"
                    if earlier
                    else "the run has no checkpoint yet"
                )
                raise ckpt.RunFolderError(
                    f"{error} (step {self.step}'s checkpoint was not written; {kept})"
                ) from error.__cause__
            raise
        if self.main and self.config.train.keep_checkpoints:
            # train.keep_checkpoints: the newest N and the best held-out one stay; only after `latest` names the new one
            with ckpt.writing(folder):
                prune_checkpoints(self.out, self.config.train.keep_checkpoints, self.step)
        self.engine.barrier()
        return target

    def _load_checkpoint(self, path: Path) -> None:
        if not path.is_dir():
            raise ValueError(f"checkpoint {path} does not exist")
        if self._verified != path:
            ckpt.verify(path)  # raises CheckpointError naming the damaged file
        state = ckpt.load(path / "state.pt")
        # model.lora: adapters of this setting, trained on the very base model.name gives now (else refused)
        check_checkpoint(self.policy.model, state.get("lora"), path, self.config.model.name)
        if self._evaluation_only:
            load_checkpoint_state_dict(self.policy.model, ckpt.load(path / "model.pt"), path / "model.pt")
            if (state.get("method") or {}).get("pool"):
                self._eval_skills_prompt = AdaptiveMethod.system_prompt_from_state(
                    state["method"], self.env.system_prompt
                )
            self.step = int(state["step"])
            return
        saved_world = int(state.get("world_size", 1))
        if saved_world != self.world_size:
            raise ValueError(
                f"--resume: checkpoint {path} was written by {saved_world} process(es); resume it "
                f"with the same number (this run has {self.world_size})"
            )
        if self.engine.name == "torch" and not (path / "optimizer.pt").exists():
            raise ValueError(
                f"--resume: checkpoint {path} was written by train.engine=deepspeed; the run's "
                "config must keep that engine"
            )
        if "method" not in state:
            raise ValueError(f"--resume: checkpoint {path} predates rwcore.AdaptiveMethod; start a new run")
        rng = state["rng"] if self.main else ckpt.load(path / f"rng_rank{self.rank}.pt")
        self.method.load_state_dict(state["method"])  # refuses another variant, naming train.method
        if self.config.loss.adaptive_entropy and state.get("entropy_control"):  # else it starts afresh, as TRL's
            self.policy_update.entropy_control.load_state_dict(state["entropy_control"])
        self.usage.load_state_dict(state.get("usage_totals"))
        self.engine.load(path)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        self.step = int(state["step"])
        self.policy.version = self.step
        self._pending_rollouts = dict(state.get("rollouts_ahead") or {})
        if self._pending_rollouts and not self.config.rollout.max_lag:
            raise ValueError(
                f"--resume: checkpoint {path} holds rollouts requested ahead (rollout.max_lag); the "
                "run's config must keep rollout.max_lag"
            )
        if self.main:
            with ckpt.writing(self.out):
                # a torn last line is dropped with a note; damage mid-file raises RunLogError (a ValueError)
                for note in truncate_after([self._metrics_path, self._sampling_path], self.step):
                    print(f"rw: {note}", file=sys.stderr, flush=True)
        self.engine.barrier()  # no rank starts before rank 0 has truncated the logs
