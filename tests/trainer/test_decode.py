"""HFGenerator's own decode loop (`_decode`) against the real `model.generate` it stands in for (`_generate`).

From the same torch seed both must give the same tokens and the same behaviour log-probs, bit for bit, and
leave torch's global generator in the same state (the next turn's draws follow from it), for the built-in
Llama and a grouped-query Qwen2, sampled at T = 1 and T = 0.7 and greedy, with and without a shared-prefix
cache, with and without suppressed tokens, and with rows that stop early (a finished row is padded), all
rows stopping before the budget, or none.
"""

from __future__ import annotations

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rwcore.trainer.envs.negotiation import NegotiationEnv
from rwcore.trainer.generation import HFGenerator, own_decoding, reserve_room
from rwcore.trainer.policy import Policy, WordCodec, build_model

VOCAB = 40
BUDGET = 12


def _model(name: str):
    torch.manual_seed(0)
    if name == "built-in llama":
        return build_model(VOCAB, 32, 2, 4, 48, 256, 0, True).eval()
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        )
    ).eval()


def _policy(model, shared: bool, allowed=None) -> Policy:
    policy = Policy(
        model,
        WordCodec(NegotiationEnv(num_train=4, num_eval=2).vocabulary()),
        torch.device("cpu"),
        shared_prefix=shared,
    )
    policy.allowed = None if allowed is None else torch.tensor(sorted(allowed))
    return policy


def _prompts(seed: int = 5) -> list[list[int]]:
    """Eight prompts of different lengths (left padding) sharing their first 12 tokens (a shared-prefix cache)."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(4, VOCAB, (12,), generator=g).tolist()
    return [prefix + torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in (1, 5, 3, 9, 2, 7, 4, 6)]


@torch.no_grad()
def _run(policy, prompts, own: bool, temperature: float, greedy: bool):
    """(new tokens [B, N], log-probs [B, N] or None, torch's generator state after)."""
    generator = HFGenerator(policy)
    ids, attention, cache = generator._inputs(prompts)
    torch.manual_seed(3)
    decode = generator._decode if own else generator._generate
    new, logprobs = decode(ids, attention, cache, temperature, BUDGET, greedy)
    return new, logprobs, torch.get_rng_state()


def _end_token(policy, prompts, temperature, greedy) -> int:
    """A token that generate samples third in the first row: as the end id, that row stops early."""
    policy.codec.end_id = 0  # the pad id, which the model never samples here (suppressed or improbable)
    new, _, _ = _run(policy, prompts, False, temperature, greedy)
    return int(new[0, 2])


@pytest.mark.parametrize("name", ["built-in llama", "qwen2 gqa"])
@pytest.mark.parametrize("temperature,greedy", [(1.0, False), (0.7, False), (1.0, True)])
@pytest.mark.parametrize("shared", [True, False], ids=["shared prefix", "plain"])
@pytest.mark.parametrize("suppress", [True, False], ids=["suppressed", "all tokens"])
def test_decode_makes_what_generate_makes(name, temperature, greedy, shared, suppress):
    model = _model(name)
    policy = _policy(model, shared, allowed=range(0, VOCAB, 2) if suppress else None)
    prompts = _prompts()
    assert (HFGenerator(policy)._inputs(prompts)[2] is not None) == shared
    policy.codec.end_id = _end_token(policy, prompts, temperature, greedy)
    (own, own_logp, own_rng), (ref, ref_logp, ref_rng) = (
        _run(policy, prompts, True, temperature, greedy),
        _run(policy, prompts, False, temperature, greedy),
    )
    assert torch.equal(own, ref)
    assert torch.equal(own_rng, ref_rng)
    if greedy:
        assert own_logp is None and ref_logp is None
    else:
        assert torch.equal(own_logp, ref_logp)
        assert torch.isfinite(own_logp).all() and (own_logp <= 0).all()
    end, pad = policy.codec.end_id, policy.codec.pad_id
    assert int(own[0, :3].tolist().index(end)) <= 2  # the first row stopped early ...
    stopped = (own == end).cumsum(dim=1) > 0
    assert (own[:, 1:][stopped[:, :-1]] == pad).all()  # ... and every finished row is padded after its end
    if suppress:
        assert set(own[~stopped | (own == end)].tolist()) <= set(range(0, VOCAB, 2))


@pytest.mark.parametrize("name", ["built-in llama", "qwen2 gqa"])
def test_decode_stops_when_every_row_has_ended(name):
    """Two allowed tokens, one of them the end: every row ends well before the budget, and both stop at once."""
    model = _model(name)
    policy = _policy(model, True, allowed=[5, 6])
    policy.codec.end_id = 5
    prompts = _prompts(seed=8)
    (own, own_logp, own_rng), (ref, ref_logp, ref_rng) = (
        _run(policy, prompts, True, 1.0, False),
        _run(policy, prompts, False, 1.0, False),
    )
    assert own.shape[1] < BUDGET and (own == 5).any(dim=1).all()
    assert torch.equal(own, ref) and torch.equal(own_logp, ref_logp) and torch.equal(own_rng, ref_rng)


def test_completions_carry_the_decoded_tokens_and_log_probs():
    model = _model("built-in llama")
    policy = _policy(model, True)
    policy.codec.end_id = 0  # no early stop: every completion has the whole budget
    prompts = _prompts()
    torch.manual_seed(3)
    completions = HFGenerator(policy)(prompts, [0] * len(prompts), 0.7, BUDGET, False)
    new, logprobs, _ = _run(policy, prompts, False, 0.7, False)
    assert [c.tokens for c in completions] == new.tolist()
    assert [c.logprobs for c in completions] == logprobs.tolist()


def test_which_models_the_own_loop_decodes():
    assert own_decoding(_model("built-in llama")) and own_decoding(_model("qwen2 gqa"))
    # a sliding window keeps only part of the cache: generate's own cache handling decodes it
    mistral = MistralForCausalLM(
        MistralConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            sliding_window=4,
        )
    )
    assert not own_decoding(mistral)


def test_reserved_cache_layers_hold_what_concatenation_holds():
    """reserve_room: writes in place within the room, concatenates past it; always DynamicLayer's values."""
    from transformers import DynamicCache

    model = _model("built-in llama")
    cache = DynamicCache(config=model.config)
    g = torch.Generator().manual_seed(0)
    states = [(torch.randn(3, 4, n, 8, generator=g), torch.randn(3, 4, n, 8, generator=g)) for n in (5, 1, 1, 1)]
    cache.layers[0].update(*states[0])  # a prefix already held (the shared-prefix cache)
    reserve_room(cache, 2)
    layer = cache.layers[0]
    keys, values = states[0]
    for step, (k, v) in enumerate(states[1:]):
        got_keys, got_values = layer.update(k, v)
        keys, values = torch.cat([keys, k], dim=-2), torch.cat([values, v], dim=-2)
        assert torch.equal(got_keys, keys) and torch.equal(got_values, values)
        assert layer.get_seq_length() == keys.shape[-2]
        within_room = step < 2
        assert (got_keys.data_ptr() == layer.buffers[0].data_ptr()) == within_room
    fresh = cache.layers[1]  # a layer with nothing yet takes its first states whole, then has room after them
    got_keys, _ = fresh.update(*states[0])
    assert torch.equal(got_keys, states[0][0]) and fresh.buffers[0].shape[-2] == 5 + 2


def test_a_checkpoint_generation_setting_the_loop_lacks_goes_through_generate():
    """A checkpoint's generation_config may add processors (Qwen2.5-Instruct ships repetition_penalty 1.05):
    generate applies them, so such a model is decoded by generate, and HFGenerator's sample is generate's."""
    model = _model("built-in llama")
    model.generation_config.repetition_penalty = 1.3
    assert not own_decoding(model)
    policy = _policy(model, True)
    policy.codec.end_id = 0
    prompts = _prompts()
    torch.manual_seed(3)
    completions = HFGenerator(policy)(prompts, [0] * len(prompts), 1.0, BUDGET, False)
    penalized, logprobs, _ = _run(policy, prompts, False, 1.0, False)
    assert [c.tokens for c in completions] == penalized.tolist()
    assert [c.logprobs for c in completions] == logprobs.tolist()
    plain, _, _ = _run(policy, prompts, True, 1.0, False)  # the loop, which has no penalty, samples otherwise
    assert not torch.equal(plain, penalized)
    # settings the loop does itself, or that HFGenerator overrides, keep it
    model.generation_config.repetition_penalty = 1.0
    model.generation_config.temperature, model.generation_config.top_k, model.generation_config.top_p = 0.6, 20, 0.95
    assert own_decoding(model)
