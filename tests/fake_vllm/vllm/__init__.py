"""A CPU stand-in for the part of vLLM's offline API that rwcore.trainer.vllm_rollout uses.

Only for tests (tests/trainer/test_vllm_rollout.py puts this folder on sys.path); the
real vLLM needs CUDA. The behavior follows vLLM's documentation:

- `LLM(model=path, ...)` loads the checkpoint at `path` into an engine of its
  own: a copy, so a weight sync that is missed shows up as stale samples;
- `generate(prompts, sampling_params=[...])` takes `{"prompt_token_ids": [...]}`
  prompts and one `SamplingParams` per prompt and returns outputs in prompt
  order; `outputs[0].token_ids` are the sampled ids, ending with the stop
  token when one was sampled (`finish_reason="stop"`), else `max_tokens` ids
  (`"length"`); a request's `seed` makes its sample reproducible;
  `allowed_token_ids` restricts sampling to those ids; temperature 0 is greedy;
- `llm.collective_rpc("reload_weights", kwargs={"weights_iterator": [(name, tensor)]})`
  replaces weights by HF parameter name; `reset_prefix_cache()`;
- `SamplingParams(logprobs=0)` returns, per sampled token, `{token: Logprob(logprob)}` of the
  distribution it was sampled from (the engine's `logprobs_mode="processed_logprobs"`:
  temperature and `allowed_token_ids` applied); `prompt_logprobs=0` the same for prompt tokens
  (`None` for the first).

Every call is appended to CALLS. INCLUDE_STOP_TOKEN=False returns outputs
without their stop token (what a vLLM that strips it would do).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

CALLS: list = []
INCLUDE_STOP_TOKEN = True


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop_token_ids: list = field(default_factory=list)
    seed: int | None = None
    detokenize: bool = True
    allowed_token_ids: list | None = None
    top_k: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None


@dataclass
class Logprob:
    logprob: float


class _Model:
    def __init__(self, hf_model):
        self.hf_model = hf_model

    @torch.no_grad()
    def load_weights(self, weights):
        state = self.hf_model.state_dict()
        for name, tensor in weights:
            state[name].copy_(tensor)  # an unknown name fails, as it does in vLLM
            CALLS.append(("load_weights", name))


class LLM:
    def __init__(self, model: str, **kwargs):
        from transformers import AutoModelForCausalLM

        CALLS.append(("init", model, kwargs))
        self.kwargs = kwargs
        hf_model = AutoModelForCausalLM.from_pretrained(
            model, torch_dtype=getattr(torch, kwargs.get("dtype", "float32"))
        )
        hf_model.eval()
        self.model = _Model(hf_model)
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(
                driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=self.model))
            )
        )

    def collective_rpc(self, method, kwargs=None):
        assert method == "reload_weights", method
        self.model.load_weights(list(kwargs["weights_iterator"]))

    def reset_prefix_cache(self):
        CALLS.append(("reset_prefix_cache",))

    @torch.no_grad()
    def generate(self, prompts, sampling_params, use_tqdm=True):
        CALLS.append(("generate", [list(p["prompt_token_ids"]) for p in prompts], list(sampling_params)))
        return [self._one(list(p["prompt_token_ids"]), params) for p, params in zip(prompts, sampling_params)]

    def _distribution(self, ids, params):
        logits = self.model.hf_model(input_ids=torch.tensor([ids])).logits[0, -1].double()
        if params.allowed_token_ids is not None:
            keep = torch.full_like(logits, float("-inf"))
            keep[params.allowed_token_ids] = 0.0
            logits = logits + keep
        return logits

    def _one(self, ids, params):
        generator = torch.Generator().manual_seed(params.seed if params.seed is not None else 0)
        tokens, reason, logprobs = [], "length", []
        for _ in range(params.max_tokens):
            logits = self._distribution(ids + tokens, params)
            if params.temperature == 0:
                token = int(logits.argmax())
                logp = torch.log_softmax(logits, -1)
            else:
                logp = torch.log_softmax(logits / params.temperature, -1)
                token = int(torch.multinomial(logp.exp(), 1, generator=generator))
            if token in params.stop_token_ids:
                reason = "stop"
                if INCLUDE_STOP_TOKEN:
                    tokens.append(token)
                    logprobs.append({token: Logprob(float(logp[token]))})
                break
            tokens.append(token)
            logprobs.append({token: Logprob(float(logp[token]))})
        prompt_logprobs = None
        if params.prompt_logprobs is not None:
            plain = SamplingParams(temperature=params.temperature)
            prompt_logprobs = [None] + [
                {
                    ids[t]: Logprob(
                        float(torch.log_softmax(self._distribution(ids[:t], plain) / params.temperature, -1)[ids[t]])
                    )
                }
                for t in range(1, len(ids))
            ]
        return SimpleNamespace(
            prompt_token_ids=ids,
            prompt_logprobs=prompt_logprobs,
            outputs=[
                SimpleNamespace(
                    token_ids=tokens, finish_reason=reason, logprobs=logprobs if params.logprobs is not None else None
                )
            ],
        )
