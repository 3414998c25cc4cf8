"""model.shared_prefix: a batch's common prompt is encoded once and its keys and values repeated.

The reference is the same model's plain forward (model.shared_prefix=off): every row encodes its whole
sequence, right-padded for the update and left-padded for HF generate. The shared path must give the same
hidden states, gradients, sampled tokens and behaviour log-probs to float rounding, and must fall back to the
plain path wherever the prefix trick does not hold.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rwcore.trainer.config import load_config
from rwcore.trainer.envs.negotiation import NegotiationEnv
from rwcore.trainer.policy import MIN_SHARED_PREFIX, Policy, WordCodec, build_model, common_prefix_length
from rwcore.trainer.rollout import HFGenerator, batch_tensors, run_episodes
from rwcore.trainer.trainer import Trainer

VOCAB = 40


def _policy(model, shared=True) -> Policy:
    env = NegotiationEnv(num_train=4, num_eval=2)
    return Policy(model, WordCodec(env.vocabulary()), torch.device("cpu"), shared_prefix=shared)


def _models():
    torch.manual_seed(0)
    yield "built-in llama", build_model(VOCAB, 32, 2, 4, 48, 256, 0, True)
    torch.manual_seed(1)
    # grouped-query attention (2 key-value heads for 4 query heads), as Qwen2 / Qwen3 checkpoints have
    yield "qwen2 gqa", Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                                    num_hidden_layers=2, num_attention_heads=4,
                                                    num_key_value_heads=2, max_position_embeddings=256))


def _batch(prefix_len: int, lengths, seed: int = 0):
    """Right-padded ids [B, L] and mask whose rows share their first `prefix_len` tokens."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(4, VOCAB, (prefix_len,), generator=g).tolist()
    rows = [prefix + torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in lengths]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return rows, ids, mask


@pytest.mark.parametrize("name,model", list(_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_hidden_states_and_gradients_match_the_plain_forward(name, model):
    model.train()
    _, ids, mask = _batch(23, [1, 9, 17, 4, 30])
    shared, plain = _policy(model, True), _policy(model, False)
    assert shared.prefix_length(ids, mask) == 23
    assert plain.prefix_length(ids, mask) == 0
    weights = torch.randn(*ids.shape, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    results = []
    for policy in (shared, plain):
        hidden = policy.hidden_states(ids, mask)
        assert hidden.shape == (*ids.shape, model.config.hidden_size)
        loss = (hidden * weights * mask[..., None]).sum()
        grads = torch.autograd.grad(loss, list(model.model.parameters()))  # the head is not in the loss
        results.append((hidden.detach() * mask[..., None], grads))
    (h1, g1), (h2, g2) = results
    torch.testing.assert_close(h1, h2, atol=1e-5, rtol=1e-5)
    for a, b in zip(g1, g2):
        # float32 sums of 5 x 50 positions in another order: agreement relative to the gradient's scale
        torch.testing.assert_close(a, b, atol=1e-5 * float(b.abs().max()), rtol=0)


def test_prefix_length_falls_back_where_sharing_does_not_hold():
    torch.manual_seed(0)
    model = build_model(VOCAB, 32, 1, 4, 48, 256, 0, True)
    policy = _policy(model)
    _, ids, mask = _batch(20, [3, 5, 8])
    assert policy.prefix_length(ids, mask) == 20
    assert policy.prefix_length(ids[:1], mask[:1]) == 0  # one row: nothing to share
    # capped so that every row keeps a token of its own: the shortest row is the prefix plus one token
    _, ids, mask = _batch(20, [0, 5, 8])
    assert policy.prefix_length(ids, mask) == 19
    _, ids, mask = _batch(MIN_SHARED_PREFIX - 1, [4, 6])
    assert policy.prefix_length(ids, mask) == 0  # too short to pay for the extra forward
    # left padding: the rows do not start together
    _, ids, mask = _batch(20, [3, 8])
    flipped_ids = torch.stack([torch.roll(ids[0], 5), ids[1]])
    flipped_mask = torch.stack([torch.roll(mask[0], 5), mask[1]])
    assert policy.prefix_length(flipped_ids, flipped_mask) == 0
    model.gradient_checkpointing_enable()
    _, ids, mask = _batch(20, [3, 5])
    assert policy.prefix_length(ids, mask) == 0
    sliding = MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                                               sliding_window=16))
    assert Policy(sliding, policy.codec, torch.device("cpu")).prefix_length(ids, mask) == 0


def test_common_prefix_length_by_hand():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5, 1], [6, 1]]) == 0
    assert common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 3
    assert common_prefix_length([]) == 0


@pytest.mark.parametrize("max_new_tokens,greedy", [(1, False), (4, False), (4, True)])
def test_generation_samples_the_same_tokens_with_the_same_log_probs(max_new_tokens, greedy):
    torch.manual_seed(0)
    model = build_model(VOCAB, 32, 2, 4, 48, 256, 0, True).eval()
    prompts, _, _ = _batch(25, [1, 6, 13, 2, 9, 20, 7], seed=5)
    runs = []
    for shared in (True, False):
        policy = _policy(model, shared)
        policy.codec.end_id = 3  # a token the random model emits now and then, so some rows stop early
        inputs = HFGenerator(policy)._inputs(prompts)
        assert (inputs[2] is not None) == shared
        torch.manual_seed(11)
        runs.append(HFGenerator(policy)(prompts, [0] * len(prompts), 0.7, max_new_tokens, greedy))
    for a, b in zip(*runs):
        assert a.tokens == b.tokens
        if greedy:
            assert a.logprobs is None and b.logprobs is None
        else:
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


def test_episodes_and_update_match_with_sharing_off():
    """A whole rollout batch of the built-in environment, then the update's forward, both ways."""
    env = NegotiationEnv(num_train=6, num_eval=2)
    torch.manual_seed(0)
    model = build_model(len(WordCodec(env.vocabulary())), 32, 2, 4, 48, 256, 0, True)
    tasks = list(env.tasks("train"))[:4]
    jobs = [(task, 100 + i, f"g{i % 2}") for i, task in enumerate(tasks * 2)]
    episodes = []
    for shared in (True, False):
        policy = _policy(model, shared)
        torch.manual_seed(7)
        episodes.append(run_episodes(env, policy, jobs, env.system_prompt, 1.0, 1))
    for a, b in zip(*episodes):
        assert a.token_ids == b.token_ids and a.generated == b.generated
        torch.testing.assert_close(a.behavior_logprobs, b.behavior_logprobs, atol=1e-5, rtol=0)
    ids, mask, _ = batch_tensors(episodes[0], 0, torch.device("cpu"))
    assert _policy(model).prefix_length(ids, mask) >= len(env.system_prompt.split())


def test_config_key_reaches_the_policy(tmp_path):
    overrides = ["train.steps=1", "rollout.tasks_per_step=2", "rollout.group_size=2", "env.options.num_train=6",
                 "env.options.num_eval=2", "train.eval_every=0", "train.checkpoint_every=0"]
    on = Trainer(load_config(None, overrides), tmp_path / "on", quiet=True)
    off = Trainer(load_config(None, overrides + ["model.shared_prefix=false"]), tmp_path / "off", quiet=True)
    on.setup()
    off.setup()
    assert on.policy.shared_prefix and not off.policy.shared_prefix
    rows = []
    for trainer in (on, off):
        torch.manual_seed(0)
        rows.append(trainer.train_step())
    assert rows[0]["loss"] == pytest.approx(rows[1]["loss"], abs=1e-5)
    assert rows[0]["success_rate"] == rows[1]["success_rate"]
    on.cleanup()
    off.cleanup()
