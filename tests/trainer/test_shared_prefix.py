"""model.shared_prefix: prompts the rows share are encoded once and their keys and values gathered for the rows.

The reference is the same model's plain forward (model.shared_prefix=off): every row encodes its whole
sequence, right-padded for the update and left-padded for HF generate. The shared path must give the same
hidden states, gradients, sampled tokens and behaviour log-probs to float rounding, and must fall back to the
plain path wherever the prefix trick does not hold.
"""

from __future__ import annotations

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rwcore.trainer.config import load_config
from rwcore.trainer.envs.negotiation import NegotiationEnv
from rwcore.trainer.generation import HFGenerator
from rwcore.trainer.policy import MIN_SHARED_PREFIX, Policy, WordCodec, build_model, common_prefix_length
from rwcore.trainer.rollout import batch_tensors, run_episodes
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
    yield (
        "qwen2 gqa",
        Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=VOCAB,
                hidden_size=32,
                intermediate_size=48,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=256,
            )
        ),
    )


def _padded(rows):
    """(ids [B, L], mask [B, L]) long, rows right-padded with 0."""
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def _batch(prefix_len: int, lengths, seed: int = 0):
    """Right-padded ids [B, L] and mask whose rows share their first `prefix_len` tokens."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(4, VOCAB, (prefix_len,), generator=g).tolist()
    rows = [prefix + torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in lengths]
    return (rows, *_padded(rows))


def _grouped(common: int, groups, seed: int = 0):
    """Right-padded ids [B, L] and mask: every row starts with the same `common` tokens, then each group
    (own prefix length, [tail lengths]) adds its own prefix and each row a random tail. The rows of the
    groups are interleaved (row i is in group i mod len(groups), in turn) so that groups are not contiguous."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda n: torch.randint(4, VOCAB, (n,), generator=g).tolist()  # noqa: E731
    start = draw(common)
    members = []
    for own, tails in groups:
        prefix = start + draw(own)
        members.append([prefix + [5 + i] + draw(n) for i, n in enumerate(tails)])  # rows differ right after
    rows = [row for chunk in zip(*members) for row in chunk]
    return (rows, *_padded(rows))


def _partition(plan, batch):
    return sorted(sorted(i for i in range(batch) if int(plan.rows[i]) == d) for d in range(plan.count))


@pytest.mark.parametrize("name,model", list(_models()), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("layout", ["batch", "interleaved groups", "runs of groups"])
def test_hidden_states_and_gradients_match_the_plain_forward(name, model, layout):
    model.train()
    if layout == "batch":
        _, ids, mask = _batch(23, [1, 9, 17, 4, 30])
        expected = 23
    else:  # 3 groups of 3 rows, 2 tokens in common and 12 per group: P = 14 shared by D = 3
        _, ids, mask = _grouped(2, [(12, [0, 6, 3]), (12, [9, 1, 4]), (12, [2, 2, 11])])
        expected = 14
        if layout == "runs of groups":
            order = [0, 3, 6, 1, 4, 7, 2, 5, 8]
            ids, mask = ids[order], mask[order]
    shared, plain = _policy(model, True), _policy(model, False)
    assert shared.prefix_length(ids, mask) == expected
    plan = shared.prefix_plan(ids, mask)
    assert plan.repeats == {"batch": 5, "interleaved groups": None, "runs of groups": 3}[layout]
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
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()  # 5.25 / before
    _, ids, mask = _batch(20, [3, 5])
    assert policy.prefix_length(ids, mask) == 0
    sliding = MistralForCausalLM(
        MistralConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=4,
            sliding_window=16,
        )
    )
    assert Policy(sliding, policy.codec, torch.device("cpu")).prefix_length(ids, mask) == 0


def test_prefix_plan_by_hand():
    """The length maximizes the positions saved, P (B - D(P)); the partition is the rows' groups."""
    torch.manual_seed(0)
    policy = _policy(build_model(VOCAB, 32, 1, 4, 48, 256, 0, True))
    # 10 common tokens, 4 groups of 2 rows adding 4 tokens each: batch-wide 10 x 7 = 70 beats 14 x 4 = 56
    _, ids, mask = _grouped(10, [(4, [3, 5])] * 4)
    plan = policy.prefix_plan(ids, mask)
    assert plan.length == 10 and plan.count == 1 and plan.rows.tolist() == [0] * 8
    # 2 groups of 4 rows: 14 x (8 - 2) = 84 beats 70; rows 0, 2, 4, 6 are the first group's
    _, ids, mask = _grouped(10, [(4, [3, 5, 2, 6])] * 2)
    plan = policy.prefix_plan(ids, mask)
    assert plan.length == 14 and plan.count == 2
    assert _partition(plan, 8) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # prefixes are numbered by their first row; interleaved rows are gathered, not repeated
    assert plan.rows.tolist() == [0, 1] * 4 and plan.firsts.tolist() == [0, 1] and plan.repeats is None
    assert (ids[plan.firsts[plan.rows], :14] == ids[:, :14]).all()
    # the same rows task by task (the trainer's layout): runs of 4, whichever prefix sorts first
    for order in ([0, 2, 4, 6, 1, 3, 5, 7], [1, 3, 5, 7, 0, 2, 4, 6]):
        plan = policy.prefix_plan(ids[order], mask[order])
        assert plan.rows.tolist() == [0] * 4 + [1] * 4 and plan.firsts.tolist() == [0, 4] and plan.repeats == 4
        spread = plan.spread(torch.tensor([[10.0], [20.0]]))
        assert spread.squeeze(1).tolist() == [10.0] * 4 + [20.0] * 4
    # no common start, 2 groups of 3 sharing 9 tokens: 9 x 4 = 36 < the 8 x 5 = 40 a batch-wide prefix of
    # MIN_SHARED_PREFIX would save; with 10 tokens per group, 10 x 4 = 40 is enough
    _, ids, mask = _grouped(0, [(MIN_SHARED_PREFIX + 1, [2, 3, 4])] * 2)
    assert policy.prefix_plan(ids, mask) is None
    _, ids, mask = _grouped(0, [(MIN_SHARED_PREFIX + 2, [2, 3, 4])] * 2)
    plan = policy.prefix_plan(ids, mask)
    assert plan.length == MIN_SHARED_PREFIX + 2 and _partition(plan, 6) == [[0, 2, 4], [1, 3, 5]]
    # a tie, 8 common tokens x (4 - 1) = 24 = 12 x (4 - 2) with 2 groups of 2 adding 4 each: the longer wins
    _, ids, mask = _grouped(8, [(4, [1, 2])] * 2)
    plan = policy.prefix_plan(ids, mask)
    assert plan.length == 12 and plan.count == 2
    # identical prompts (a group's first turn) share all but the last token
    ids = torch.tensor([[7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]] * 3 + [[9] * 11] * 3)
    plan = policy.prefix_plan(ids)
    assert plan.length == 10 and _partition(plan, 6) == [[0, 1, 2], [3, 4, 5]]


def test_common_prefix_length_by_hand():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5, 1], [6, 1]]) == 0
    assert common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 3
    assert common_prefix_length([]) == 0


@pytest.mark.parametrize(
    "max_new_tokens,greedy,layout",
    [(1, False, "batch"), (4, False, "batch"), (4, True, "batch"), (4, False, "groups"), (4, True, "groups")],
)
def test_generation_samples_the_same_tokens_with_the_same_log_probs(max_new_tokens, greedy, layout):
    torch.manual_seed(0)
    model = build_model(VOCAB, 32, 2, 4, 48, 256, 0, True).eval()
    if layout == "batch":
        prompts, _, _ = _batch(25, [1, 6, 13, 2, 9, 20, 7], seed=5)
    else:  # 2 groups of 4 whose prompts are identical within the group (the first turn) and 2 of 3 that differ
        prompts, _, _ = _grouped(3, [(14, [0] * 4), (14, [0] * 4)], seed=5)
        prompts = [row[:-1] for row in prompts]  # drop the per-row marker: identical within each group
        prompts += _grouped(3, [(14, [1, 5, 9]), (14, [2, 0, 6])], seed=6)[0]
        assert _policy(model).prefix_length(torch.tensor([p[:17] for p in prompts])) == 16
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
    overrides = [
        "model.init=random",
        "train.steps=1",
        "rollout.tasks_per_step=2",
        "rollout.group_size=2",
        "env.options.num_train=6",
        "env.options.num_eval=2",
        "train.eval_every=0",
        "train.checkpoint_every=0",
    ]
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
