"""vLLM rollouts: agent messages sampled by a colocated vLLM engine whose weights follow the policy.

`rollout.engine=vllm` builds one `vllm.LLM` per training process, in the
process itself (`distributed_executor_backend="external_launcher"`, as TRL's
colocate mode does), on the same GPU as training. After every policy update
the trainer pushes the new weights into it (`sync`), so each step's rollouts
come from the current policy; a resumed run pushes the checkpoint's weights
before its first rollout.

Behavior log-probs are still computed by the training model after the
episodes (rwcore.trainer.rollout.score_behavior): the importance ratios of
the loss then compare the training model's numerics with themselves, not
vLLM's sampler with the training model.

Each request carries its own seed (derived from the episode seed and the
turn), so rollouts do not depend on batch composition or on torch's global
generator.

The built-in model is saved to a temporary folder for vLLM to load (its
word-level tokenizer is never used by vLLM: prompts are token ids); a
`model.name` is loaded by vLLM from the same name or path.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence

import torch

from rwcore.trainer.engines import launcher_environment


def import_vllm():
    try:
        import vllm
    except ImportError as error:
        raise ValueError("rollout.engine=vllm needs vLLM on a CUDA machine: pip install 'rwcore[vllm]' "
                         f"(or pip install vllm) ({error})") from None
    return vllm


class VLLMGenerator:
    """A `Generator` (see rwcore.trainer.rollout) backed by vLLM; `sync(model)` after each update."""

    def __init__(self, policy, model_name: str | None, dtype: str, gpu_memory_utilization: float,
                 max_model_len: int, seed: int) -> None:
        vllm = import_vllm()
        self._sampling_params = vllm.SamplingParams
        self.end_id = policy.codec.end_id
        self.allowed = policy.allowed.tolist() if policy.allowed is not None else None
        self._folder = None
        if model_name:
            source = model_name
        else:
            self._folder = tempfile.mkdtemp(prefix="rwcore-vllm-")
            policy.model.save_pretrained(self._folder, safe_serialization=True)
            source = self._folder
        launcher_environment()
        self.llm = vllm.LLM(
            model=source, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
            tensor_parallel_size=1, distributed_executor_backend="external_launcher", seed=seed,
            skip_tokenizer_init=not model_name,  # prompts and outputs are token ids
        )
        self.synced_updates = 0

    def _model(self):
        return self.llm.llm_engine.model_executor.driver_worker.model_runner.model

    @torch.no_grad()
    def sync(self, model: torch.nn.Module) -> None:
        """Pushes `model`'s weights (HF parameter names) into the vLLM engine and drops its prefix cache."""
        target = self._model()
        for name, tensor in model.state_dict().items():
            target.load_weights([(name, tensor)])
        self.llm.reset_prefix_cache()
        self.synced_updates += 1

    def __call__(self, prompts: Sequence[list[int]], seeds: Sequence[int], temperature: float,
                 max_new_tokens: int, greedy: bool) -> list[list[int]]:
        params = [self._sampling_params(n=1, temperature=0.0 if greedy else temperature, top_p=1.0,
                                        max_tokens=max_new_tokens, stop_token_ids=[self.end_id], seed=int(seed),
                                        detokenize=False, allowed_token_ids=self.allowed)
                  for seed in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sampling_params=params,
                                    use_tqdm=False)
        completions = []
        for output in outputs:
            sample = output.outputs[0]
            tokens = list(sample.token_ids)
            if sample.finish_reason == "stop" and (not tokens or tokens[-1] != self.end_id):
                tokens.append(self.end_id)  # the stop token was sampled but not returned
            completions.append(tokens)
        return completions

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
