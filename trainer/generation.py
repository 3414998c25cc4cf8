"""Sampling agent messages: the `Generator` protocol every rollout engine implements (one `Completion` per
prompt), and `HFGenerator`, the default engine, on the policy's own HF model.

HFGenerator left-pads the batch (a shared prefix is encoded once) and samples either with its own decode
loop, which makes the calls and random draws HF `model.generate` makes, or with `generate` itself; each
sampled token's log-prob is the one under the distribution it was drawn from (temperature and token
suppression applied). The vLLM engine is rwcore.trainer.vllm_rollout.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from rwcore.trainer.policy import cache_keyword, output_cache, supports_shared_prefix


@dataclass
class Completion:
    """One sampled agent message: its token ids and, when the engine reports them, the log-prob of each
    under the distribution it was sampled from (temperature and allowed tokens applied); None for greedy
    decoding or an engine that does not report them."""

    tokens: list[int]
    logprobs: list[float] | None = None


class Generator(Protocol):
    """Samples one agent message per prompt.

    prompts: token-id lists (the conversations so far); seeds: one int per
    prompt (engines with per-request generators use it; HFGenerator draws from
    torch's global generator instead, as HF generate does). Returns one `Completion` per prompt:
    its tokens end with the codec's end id when the policy chose to stop,
    otherwise they are exactly `max_new_tokens` ids.
    """

    def __call__(
        self, prompts: Sequence[list[int]], seeds: Sequence[int], temperature: float, max_new_tokens: int, greedy: bool
    ) -> list[Completion]: ...


def pad_left(sequences: Sequence[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, W], mask [B, W]) long, left-padded to the longest sequence (one tensor built from lists:
    per-row tensors cost more than the model's forward on small batches)."""
    width = max(len(s) for s in sequences)
    ids = torch.tensor([[pad_id] * (width - len(s)) + list(s) for s in sequences], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], dtype=torch.long)
    return ids.to(device), mask.to(device)


class _SampledLogProbs:
    """The one `generate` logits processor: it suppresses the tokens generation must never produce, then
    records the log-prob of each sampled token under the distribution it was drawn from: log_softmax(scores / T)
    over the scores generate samples from (no top-k / top-p here). It holds one step's [B, V] log-probs at a
    time (a step's token is read from input_ids at the next call, the last one from the final sequences),
    never the [B, new tokens, V] that `output_scores` would keep.

    Suppression gives the same scores as generate's own `suppress_tokens` processor (-inf at those ids, the
    rest untouched), which ran just before this one; doing both here spares generate's processor list one
    `inspect.signature` per processor per token. `temperature=None` (greedy) suppresses without recording."""

    def __init__(self, temperature: float | None, suppressed: Sequence[int] | None = None) -> None:
        self.temperature = None if temperature is None else float(temperature)
        self.suppressed = list(suppressed) if suppressed else []
        self.mask: torch.Tensor | None = None  # [V] bool, built at the first call from the scores' width
        self.previous: torch.Tensor | None = None
        self.columns: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.suppressed:
            if self.mask is None:
                self.mask = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
                self.mask[torch.tensor(self.suppressed, dtype=torch.long, device=scores.device)] = True
            scores = scores.masked_fill(self.mask, -float("inf"))
        if self.temperature is None:
            return scores
        if self.previous is not None:
            self.columns.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """[B, new tokens] log-probs of `new_tokens` (generate's output after the prompt)."""
        if self.previous is not None and len(self.columns) < new_tokens.shape[1]:
            self.columns.append(
                self.previous.gather(-1, new_tokens[:, len(self.columns) : len(self.columns) + 1]).squeeze(-1)
            )
        self.previous = None
        return (
            torch.stack(self.columns, dim=1)
            if self.columns
            else new_tokens.new_zeros(new_tokens.shape, dtype=torch.float32)
        )


class HFGenerator:
    """Sampling with the policy's own HF model, left-padded; each sampled token's log-prob under the
    distribution it was drawn from (temperature and token suppression applied).

    A decoder-only model with full attention and HF's plain DynamicCache (`supports_shared_prefix`: the
    built-in model and the usual HF causal LMs) is decoded by `_decode`, a loop over the model's forward
    that makes the calls and random draws `model.generate` makes — the same tokens and log-probs from the same
    torch seed (tests/trainer/test_decode.py checks it against generate) — without generate's per-call set-up and its
    per-token logits-processor and stopping-criteria machinery, and with the cache written in place
    (`reserve_room`) rather than copied whole at every token: together about a seventh of a tiny model's
    rollout time on a CPU. Any other model goes through `model.generate`."""

    def __init__(self, policy) -> None:
        self.policy = policy

    @torch.no_grad()
    def __call__(self, prompts, seeds, temperature, max_new_tokens, greedy):
        policy = self.policy
        input_ids, attention, cache = self._inputs(prompts)
        if own_decoding(policy.model):
            new, logprobs = self._decode(input_ids, attention, cache, temperature, max_new_tokens, greedy)
        else:
            new, logprobs = self._generate(input_ids, attention, cache, temperature, max_new_tokens, greedy)
        completions = [Completion(row) for row in new.tolist()]
        if logprobs is not None:
            for completion, row in zip(completions, logprobs.tolist()):
                completion.logprobs = row
        return completions

    def _generate(self, input_ids, attention, cache, temperature, max_new_tokens, greedy):
        """(new tokens [B, N] long, their log-probs [B, N] fp32 or None when greedy) from `model.generate`."""
        from transformers import LogitsProcessorList

        policy, codec = self.policy, self.policy.codec
        # custom processors run before generate's temperature warper (and there is no top-k / top-p here),
        # so the recorder applies the temperature itself
        recorder = _SampledLogProbs(None if greedy else temperature, policy.suppressed())
        output = policy.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            **{cache_keyword(policy.model): cache},
            do_sample=not greedy,
            temperature=temperature if not greedy else None,
            top_k=0,
            top_p=1.0,
            eos_token_id=codec.end_id,
            pad_token_id=codec.pad_id,
            logits_processor=LogitsProcessorList([recorder]),
        )
        new = output[:, input_ids.shape[1] :]
        return new, None if greedy else recorder.finish(new)

    def _decode(self, input_ids, attention, cache, temperature, max_new_tokens, greedy):
        """(new tokens [B, N] long, their log-probs [B, N] fp32 or None when greedy), N <= max_new_tokens, as
        `model.generate` makes them (transformers 5.x `_sample`): positions from the attention mask (cumsum - 1,
        padding at 0), the prompt after the cache in one forward and then one token per forward, logits of the
        last position only (`logits_to_keep=1`) in fp32, suppressed ids at -inf, scores / T when T != 1, softmax
        and one `torch.multinomial` draw per row per step from torch's global generator (argmax when greedy),
        a finished row's later tokens set to the pad id, and a stop once every row has ended or at N tokens.
        The log-prob of a sampled token is log_softmax(scores / T) at it (`_SampledLogProbs`' figure). The
        caller holds torch.no_grad."""
        from transformers import DynamicCache

        policy, codec = self.policy, self.policy.codec
        model = policy.model
        batch = input_ids.shape[0]
        if cache is None:
            cache = DynamicCache(config=model.config)
        past = cache.get_seq_length()
        reserve_room(cache, input_ids.shape[1] - past + max_new_tokens)
        positions = (attention.long().cumsum(-1) - 1).masked_fill(attention == 0, 0)
        step_ids, step_positions = input_ids[:, past:], positions[:, past:]
        suppressed = policy.suppressed()
        blocked = None
        unfinished = torch.ones(batch, dtype=torch.long, device=input_ids.device)
        tokens, logprobs = [], []
        cache_argument = {cache_keyword(model): cache}
        for _ in range(max_new_tokens):
            output = model(
                input_ids=step_ids,
                attention_mask=attention,
                position_ids=step_positions,
                use_cache=True,
                logits_to_keep=1,
                return_dict=True,
                **cache_argument,
            )
            scores = output.logits[:, -1].to(copy=True, dtype=torch.float32)
            del output
            if suppressed:
                if blocked is None:  # [V] bool over the logits' width, as generate's suppress_tokens processor
                    blocked = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
                    blocked[torch.tensor(suppressed, dtype=torch.long, device=scores.device)] = True
                scores = scores.masked_fill(blocked, -float("inf"))
            if greedy:
                chosen = torch.argmax(scores, dim=-1)
            else:
                logp = torch.log_softmax(scores / temperature, dim=-1)
                if temperature != 1.0:  # generate's temperature warper runs only then
                    scores = scores / temperature
                chosen = torch.multinomial(torch.nn.functional.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            chosen = chosen * unfinished + codec.pad_id * (1 - unfinished)
            tokens.append(chosen)
            if not greedy:  # (a finished row's figure is its pad's, as the recorder's; the caller drops it)
                logprobs.append(logp.gather(-1, chosen[:, None]).squeeze(-1))
            unfinished = unfinished & (chosen != codec.end_id).long()
            if not bool(unfinished.any()):
                break
            attention = torch.cat([attention, attention.new_ones((batch, 1))], dim=-1)
            step_ids, step_positions = chosen[:, None], step_positions[:, -1:] + 1
        if not tokens:
            empty = input_ids.new_zeros((batch, 0))
            return empty, None if greedy else empty.float()
        return torch.stack(tokens, dim=1), None if greedy else torch.stack(logprobs, dim=1)

    def _inputs(self, prompts: Sequence[list[int]]):
        """(input_ids [B, W], attention_mask [B, W], prefix cache or None) for generate.

        Plain: left-padded. With a shared prefix of P tokens (Policy.prefix_plan: the system prompt and
        Arise's skills for the whole batch, or a group's whole prompt so far), each distinct prefix is encoded
        once and its cache gathered for its rows, the padding sits between the prefix and each row's own
        tokens, and generate encodes only those: positions come from the attention mask, so every token
        keeps the position it has in the unpadded prompt."""
        policy, codec = self.policy, self.policy.codec
        shortest = min(len(p) for p in prompts)
        common = torch.tensor([list(p[:shortest]) for p in prompts], dtype=torch.long)
        plan = policy.prefix_plan(common) if shortest > 0 else None
        if plan is None:
            return (*pad_left(prompts, codec.pad_id, policy.device), None)
        prefix = plan.length
        width = max(len(p) for p in prompts) - prefix
        pad = codec.pad_id
        input_ids = torch.tensor(
            [list(p[:prefix]) + [pad] * (width + prefix - len(p)) + list(p[prefix:]) for p in prompts], dtype=torch.long
        )
        attention = torch.tensor(
            [[1] * prefix + [0] * (width + prefix - len(p)) + [1] * (len(p) - prefix) for p in prompts],
            dtype=torch.long,
        )
        input_ids, attention = input_ids.to(policy.device), attention.to(policy.device)
        cache = output_cache(policy.model.model(input_ids=input_ids[plan.firsts, :prefix], use_cache=True))
        plan.spread_cache(cache)
        return input_ids, attention, cache


@functools.cache
def _reserved_layer_class():
    """_ReservedLayer, built at first use (transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class _ReservedLayer(DynamicLayer):
        """A DynamicLayer that writes each forward's keys and values into room reserved for the whole
        generation, where DynamicLayer concatenates them onto a fresh copy of the whole cache (one copy per
        layer per token). `keys` / `values` are views of the first positions of the buffers: the same values
        DynamicLayer would hold, so attention computes the same numbers (tests/trainer/test_decode.py). Past the room
        it concatenates, as DynamicLayer does."""

        def __init__(self, room: int, keys: torch.Tensor | None = None, values: torch.Tensor | None = None):
            super().__init__()
            self.room = room
            self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
            if keys is not None and keys.numel():
                self.lazy_initialization(keys, values)
                self._allocate(keys, values)

        def _allocate(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            length = keys.shape[-2]
            self.buffers = tuple(t.new_empty((*t.shape[:-2], length + self.room, t.shape[-1])) for t in (keys, values))
            for buffer, states in zip(self.buffers, (keys, values)):
                buffer[..., :length, :] = states
            self.keys, self.values = (buffer[..., :length, :] for buffer in self.buffers)

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            if self.buffers is None:
                self._allocate(key_states, value_states)
                return self.keys, self.values
            start, added = self.keys.shape[-2], key_states.shape[-2]
            if start + added > self.buffers[0].shape[-2]:
                return super().update(key_states, value_states, *args, **kwargs)
            for buffer, states in zip(self.buffers, (key_states, value_states)):
                buffer[..., start : start + added, :] = states
            self.keys, self.values = (buffer[..., : start + added, :] for buffer in self.buffers)
            return self.keys, self.values

    return _ReservedLayer


def reserve_room(cache, room: int) -> None:
    """Gives every layer of an HF DynamicCache (plain DynamicLayers only; `own_decoding` models) `room` more
    positions written in place, keeping what it holds."""
    reserved = _reserved_layer_class()
    cache.layers = [
        reserved(room, layer.keys if layer.is_initialized else None, layer.values if layer.is_initialized else None)
        for layer in cache.layers
    ]


# generation_config entries `_decode` accounts for: token ids and sampling settings HFGenerator passes to
# generate itself, and flags that change no logits. Any other entry a checkpoint sets (a repetition penalty,
# min_p, a cache implementation, forced tokens, ...) would make generate sample differently.
_DECODED_GENERATION_KEYS = frozenset(
    {
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "max_length",
        "max_new_tokens",
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "output_scores",
        "output_logits",
        "return_dict_in_generate",
        "transformers_version",
        "_from_model_config",
    }
)
# values at which other entries change nothing (checkpoints often spell them out)
_NEUTRAL_GENERATION_VALUES = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "min_length": 0,
    "min_new_tokens": 0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "length_penalty": 1.0,
    "num_beams": 1,
    "num_beam_groups": 1,
    "num_return_sequences": 1,
    "diversity_penalty": 0.0,
    "renormalize_logits": False,
    "remove_invalid_values": False,
    "early_stopping": False,
}


def own_decoding(model: torch.nn.Module) -> bool:
    """Whether HFGenerator decodes `model` with its own loop (`HFGenerator._decode`) rather than
    `model.generate`: a decoder-only causal LM whose forward takes `logits_to_keep`, whose cache is HF's
    plain DynamicCache over full attention in every layer (`supports_shared_prefix`), and whose
    generation_config sets nothing `_decode` does not do (`_DECODED_GENERATION_KEYS`, or a neutral value)."""
    import inspect

    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False) or not supports_shared_prefix(model):
        return False
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return False
    generation = getattr(model, "generation_config", None)
    if generation is None:
        return True
    default, unset = _default_generation_settings(), object()
    return all(
        key in _DECODED_GENERATION_KEYS
        or value is None
        or key.startswith("_")
        or default.get(key, unset) == value
        or _NEUTRAL_GENERATION_VALUES.get(key, unset) == value
        for key, value in vars(generation).items()
    )


@functools.cache
def _default_generation_settings() -> dict:
    """A default GenerationConfig's attributes (what a checkpoint's generation_config is compared with)."""
    from transformers import GenerationConfig

    return dict(vars(GenerationConfig()))
