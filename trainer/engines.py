"""Training engines: how the policy's parameters are updated, and by how many processes.

`TorchEngine` is plain PyTorch AdamW in one process. `DeepSpeedEngine` wraps
the same model in DeepSpeed ZeRO (stages 0-2) and runs data-parallel over the
processes `deepspeed` or `torchrun` started (or one process when run
directly); on a machine without CUDA it uses DeepSpeed's CPU accelerator and
gloo, which is how it is tested here.

Both expose one small interface the trainer drives once per optimizer step:
`set_lr(lr)`, `zero_grad()`, `accumulate(loss)` for each micro-batch, `step() -> grad norm`,
plus `save(folder)` / `load(folder)` and the few collectives the trainer
needs to keep every rank's adaptive state identical (`all_gather`,
`broadcast`, `all_mean`, `barrier`). On one process the collectives are
identities.

Both optimize and clip the parameters with requires_grad alone (`trainable_parameters`): every weight
of a plain model, the adapters of a LoRA one (model.lora.rank > 0), whose checkpoints then hold the
adapter and its optimizer state (`rwcore.trainer.lora.checkpoint_state_dict`).

Gradient scale: the trainer normalizes each rank's loss by
`tokens_denominator(global_tokens)`; DeepSpeed averages gradients over
ranks, so the denominator is the global model-token count divided by the
world size, which makes the update equal to a one-process update on the
whole batch (tests/trainer/test_engines.py checks this with two processes).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import torch

from rwcore.trainer.lora import checkpoint_state_dict, is_lora, load_checkpoint_state_dict, trainable_parameters

# Keys the trainer owns in a DeepSpeed config: it feeds micro-batches itself and counts them.
_RESERVED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


class TorchEngine:
    """AdamW on one process, over the trainable parameters."""

    name = "torch"
    rank = 0
    world_size = 1

    def __init__(self, model: torch.nn.Module, lr: float, weight_decay: float, grad_clip: float) -> None:
        self.model = model
        self.parameters = trainable_parameters(model)  # a LoRA model's adapters alone
        self.optimizer = torch.optim.AdamW(self.parameters, lr=lr, weight_decay=weight_decay)
        self.grad_clip = grad_clip

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def accumulate(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        """Clips (grad_clip 0 = no clipping) and steps; returns the pre-clip gradient norm."""
        norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.grad_clip or float("inf"))
        self.optimizer.step()
        return float(norm)

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next optimizer step (the trainer's warm-up / schedule)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def tokens_denominator(self, global_tokens: torch.Tensor) -> torch.Tensor:
        return global_tokens

    def save(self, folder: Path) -> None:
        from rwcore.trainer.checkpoint import save  # through a Python file, fsynced: ENOSPC is an OSError

        save(checkpoint_state_dict(self.model), folder / "model.pt", encoded=False)
        save(self.optimizer.state_dict(), folder / "optimizer.pt", encoded=False)

    def load(self, folder: Path) -> None:
        from rwcore.trainer.checkpoint import load  # the restricted unpickler; a refusal is one line naming the file

        load_checkpoint_state_dict(self.model, load(folder / "model.pt", decoded=False), folder / "model.pt")
        self.optimizer.load_state_dict(load(folder / "optimizer.pt", decoded=False))

    # One process: the collectives are identities.
    def all_gather(self, value: Any) -> list:
        return [value]

    def broadcast(self, value: Any) -> Any:
        return value

    def all_mean(self, values: dict[str, float]) -> dict[str, float]:
        return dict(values)

    def all_sum_tensor(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass


class DeepSpeedEngine:
    """DeepSpeed ZeRO data parallelism; one instance per process.

    The model's parameters stay whole on every rank (stages 0-2 shard
    optimizer state and gradients, not parameters), so rollouts run on the
    plain module without gathering. Stage 3 is refused: rollouts would need
    every rank to gather the full weights in lockstep.
    """

    name = "deepspeed"

    def __init__(
        self,
        model: torch.nn.Module,
        lr: float,
        weight_decay: float,
        grad_clip: float,
        zero_stage: int,
        micro_batches: int,
        dtype: str,
        config_file: str = "",
    ) -> None:
        deepspeed = import_deepspeed()
        init_distributed(deepspeed)
        import torch.distributed as dist

        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        # NCCL reduces device tensors only; gloo (the CPU accelerator) host tensors.
        self._reduce_device = (
            torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        )
        self.micro_batches = micro_batches
        config = deepspeed_config(zero_stage, grad_clip, micro_batches, self.world_size, dtype, config_file)
        self.zero_stage = config["zero_optimization"].get("stage", 0)
        optimizer = None
        self.parameters = trainable_parameters(model)  # a LoRA model's adapters alone
        if "optimizer" not in config:
            # The same AdamW as the torch engine; ZeRO shards its state. A config file may name DeepSpeed's own.
            optimizer = torch.optim.AdamW(self.parameters, lr=lr, weight_decay=weight_decay)
            config["zero_allow_untested_optimizer"] = True
        self.model = model
        self.engine, *_ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            config=config,
            model_parameters=None if optimizer is not None else self.parameters,
        )
        self._pending = 0

    def zero_grad(self) -> None:
        self._pending = 0  # DeepSpeed clears gradients itself after each optimizer step

    def accumulate(self, loss: torch.Tensor) -> None:
        # The loss is already normalized by the step's token count: no division by the micro-batch count.
        self.engine.backward(loss, scale_wrt_gas=False)
        self._pending += 1
        if self._pending > self.micro_batches:
            raise RuntimeError(f"DeepSpeedEngine: more than {self.micro_batches} micro-batches in one step")
        if self._pending < self.micro_batches:
            self.engine.step()  # not a boundary: DeepSpeed only counts the micro-batch

    def step(self) -> float:
        if self._pending != self.micro_batches:
            raise RuntimeError(f"DeepSpeedEngine: step() after {self._pending} of {self.micro_batches} micro-batches")
        norm = None
        if self.zero_stage == 0:
            # DeepSpeed records the norm only in its ZeRO optimizers; below them the gradients are already
            # averaged over ranks at the last micro-batch, so the norm is read before the step clears them.
            with torch.no_grad():
                norm = torch.linalg.vector_norm(
                    torch.stack(
                        [torch.linalg.vector_norm(p.grad.float()) for p in self.parameters if p.grad is not None]
                    )
                )
        self.engine.step()
        self._pending = 0
        if norm is None:
            norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next optimizer step (set on DeepSpeed's wrapped optimizer's groups)."""
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    def tokens_denominator(self, global_tokens: torch.Tensor) -> torch.Tensor:
        return global_tokens / self.world_size

    def save(self, folder: Path) -> None:
        """Collective: every rank writes its ZeRO shard; rank 0 also writes the whole model as model.pt
        (parameters are replicated below stage 3), which `rw eval` and plain PyTorch can load. A LoRA model's
        frozen base stays out of both (model.pt: `checkpoint_state_dict`)."""
        lora = is_lora(self.model)
        self.engine.save_checkpoint(str(folder), tag="deepspeed", save_latest=False, exclude_frozen_parameters=lora)
        if self.rank == 0:
            from rwcore.trainer.checkpoint import save

            save(checkpoint_state_dict(self.model), folder / "model.pt", encoded=False)

    def load(self, folder: Path) -> None:
        if not (folder / "deepspeed").is_dir():
            raise ValueError(f"checkpoint {folder} was not written by train.engine=deepspeed (no deepspeed/ folder)")
        lora = is_lora(self.model)
        path, _ = self.engine.load_checkpoint(
            str(folder),
            tag="deepspeed",
            load_module_strict=not lora,  # a LoRA checkpoint leaves the frozen base out
            load_optimizer_states=True,
            load_lr_scheduler_states=False,
        )
        if path is None:
            raise ValueError(f"checkpoint {folder}: DeepSpeed could not load its deepspeed/ folder")
        if lora:  # the adapters again, through the check that they are exactly this model's (and the built-in base)
            from rwcore.trainer.checkpoint import load

            load_checkpoint_state_dict(self.model, load(folder / "model.pt", decoded=False), folder / "model.pt")

    def all_gather(self, value: Any) -> list:
        gathered: list = [None] * self.world_size
        self._dist.all_gather_object(gathered, value)
        return gathered

    def broadcast(self, value: Any) -> Any:
        box = [value if self.rank == 0 else None]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_mean(self, values: dict[str, float]) -> dict[str, float]:
        names = sorted(values)
        packed = torch.tensor([float(values[name]) for name in names], dtype=torch.float64, device=self._reduce_device)
        self._dist.all_reduce(packed)
        return {name: float(total) / self.world_size for name, total in zip(names, packed.tolist())}

    def all_sum_tensor(self, value: torch.Tensor) -> torch.Tensor:
        total = value.detach().to(device=self._reduce_device, dtype=torch.float64).clone()
        self._dist.all_reduce(total)
        return total.to(device=value.device, dtype=torch.float32)

    def barrier(self) -> None:
        self._dist.barrier()

    def close(self) -> None:
        destroy = getattr(self.engine, "destroy", None)
        if destroy is not None:
            destroy()


def import_deepspeed():
    try:
        import deepspeed
    except ImportError as error:
        raise ValueError(
            "train.engine=deepspeed needs DeepSpeed: pip install 'rwcore[deepspeed]' "
            f"(or pip install deepspeed) ({error})"
        ) from None
    return deepspeed


def init_distributed(deepspeed) -> None:
    """Joins the process group `deepspeed`/`torchrun` described in the environment; without a launcher,
    a one-process group on loopback."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    launcher_environment()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(verbose=False)


def launcher_environment() -> None:
    """The torch.distributed variables a launcher sets; without one, those of a single process on loopback."""
    if "RANK" in os.environ:
        return
    os.environ.update(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": os.environ.get("MASTER_PORT") or str(_free_port()),
        }
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def deepspeed_config(
    zero_stage: int, grad_clip: float, micro_batches: int, world_size: int, dtype: str, config_file: str = ""
) -> dict:
    """The DeepSpeed config the trainer runs with; `config_file` (JSON) is merged over it, except the
    batch-size keys, which follow rollout.* and optim.minibatches."""
    if zero_stage not in (0, 1, 2):
        raise ValueError(
            f"train.zero_stage={zero_stage}: supported ZeRO stages are 0, 1, 2 (stage 3 shards the "
            "parameters, and rollouts need whole weights on every rank)"
        )
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,  # nominal: the trainer forms micro-batches of whole rollouts itself
        "gradient_accumulation_steps": micro_batches,
        "train_batch_size": micro_batches * world_size,
        "gradient_clipping": float(grad_clip),
        "zero_optimization": {"stage": zero_stage},
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise ValueError(f"train.deepspeed_config: {config_file} is not a file")
        try:
            extra = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"train.deepspeed_config: {config_file} is not valid JSON ({error})") from None
        if not isinstance(extra, dict):
            raise ValueError(f"train.deepspeed_config: {config_file} must hold a JSON object")
        reserved = sorted(set(extra) & set(_RESERVED_KEYS))
        if reserved:
            raise ValueError(
                f"train.deepspeed_config: {config_file} sets {', '.join(reserved)}; the trainer sets "
                "these from rollout.tasks_per_step, rollout.group_size and optim.minibatches"
            )
        stage = extra.get("zero_optimization", {}).get("stage", zero_stage)
        if stage not in (0, 1, 2):
            raise ValueError(f"train.deepspeed_config: zero_optimization.stage={stage} is not supported (0, 1, 2)")
        config = _merge(config, extra)
    return config


def _merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = (
            _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged
