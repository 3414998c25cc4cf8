"""The reading corpus and the negotiation environment's guidance language (rwcore.trainer.prior.corpus).

The corpus must teach reading, not the task: every line parses back to the situation and move it was drawn
for, pairings are uniform, held-out pairings and the environment's skill texts never occur, and an example's
moves win a held-out task no more often than random moves do.
"""

import random
from collections import Counter

import pytest

from rwcore.arise.pool.prompt import render_system_prompt
from rwcore.trainer.envs.negotiation import (
    GUIDANCE_SITUATIONS,
    NegotiationEnv,
    observe_situation,
    random_policy,
    scripted_policy,
    situation_of,
)
from rwcore.trainer.envs.negotiation.rubrics import RULES_BY_ID, SKILLS
from rwcore.trainer.policy import WordCodec
from rwcore.trainer.prior.corpus import (
    CorpusSpec,
    encode_conversation,
    fillers_for,
    heldout_pairs,
    make_example,
    parse_guidance,
)

ENV = NegotiationEnv()
LANGUAGE = ENV.guidance_language()
CODEC = WordCodec(ENV.vocabulary())
SPEC = CorpusSpec()
FILLERS = fillers_for(LANGUAGE, ENV.vocabulary())
HELDOUT = set(heldout_pairs(LANGUAGE, SPEC))
CHI2_001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}  # chi-square quantiles, p = 0.001


def example(index, spec=SPEC):
    return make_example(
        index,
        spec,
        LANGUAGE,
        CODEC,
        ENV.system_prompt,
        ENV.max_turns,
        HELDOUT,
        FILLERS,
        forbidden=set(LANGUAGE.skill_texts),
    )


@pytest.fixture(scope="module")
def corpus():
    return [example(i) for i in range(3000)]


# -- the guidance language ------------------------------------------------------------------------------------


def test_observations_show_the_situation_they_were_drawn_for():
    rng = random.Random(0)
    for situation in GUIDANCE_SITUATIONS:
        for _ in range(40):
            assert situation_of(observe_situation(situation.name, rng)) == situation.name
    with pytest.raises(ValueError, match="unknown situation 'nope'"):
        observe_situation("nope", rng)


def test_every_observation_an_agent_answers_shows_one_situation():
    """Random and scripted play on every held-out task: each observation before the episode ends is one of the
    language's situations (the ones after it, none), and between them they reach every situation."""
    seen = Counter()
    rng = random.Random(1)
    for task in ENV.tasks("eval"):
        for policy in (scripted_policy, lambda obs: random_policy(obs, rng)):
            episode = ENV.reset(task, 0)
            while not episode.done:
                situation = situation_of(episode.observation)
                assert situation is not None, episode.observation
                seen[situation] += 1
                episode = ENV.step(episode, policy(episode.observation))
            assert situation_of(episode.observation) is None, episode.observation
    reached = set(seen)
    # a bundle proposed before asking ("buyer likes bundle" without a budget) only follows the move `bundle` first
    episode = ENV.step(ENV.reset(next(t for t in ENV.tasks("eval") if t.data["kind"] == "bundle"), 0), "bundle")
    reached.add(situation_of(episode.observation))
    assert reached == {s.name for s in GUIDANCE_SITUATIONS}


def test_parse_guidance_by_hand():
    assert parse_guidance("when the buyer agrees say confirm", LANGUAGE) == ("agrees", "confirm")
    assert parse_guidance("if the buyer likes bundle budget say match", LANGUAGE) == ("likes_bundle_budget", "match")
    assert parse_guidance("after the buyer likes bundle say ask", LANGUAGE) == ("likes_bundle", "ask")
    assert parse_guidance("when the buyer wants bundle say bundle", LANGUAGE) == ("wants_bundle", "bundle")
    assert parse_guidance("use one clear move each turn", LANGUAGE) is None  # no situation, no move
    assert parse_guidance("when the buyer agrees say confirm or close", LANGUAGE) is None  # two moves
    assert parse_guidance("when the buyer agrees or the buyer confirms say close", LANGUAGE) is None  # two situations


# which situation each rule judges, and the move it wants there (written from the rules' criteria)
RULE_ADVICE = {
    "asks_budget_first": {("wants_item", "ask")},
    "offers_at_budget": {("budget_above", "match")},
    "proposes_bundle_when_wanted": {("wants_bundle", "bundle"), ("bundle_budgets", "bundle")},
    "offers_bundle_when_wanted": {("likes_bundle_budget", "match")},
    "opens_at_list_with_haggler": {("haggles", "list")},
    "quotes_list_price": {("wants_price", "list")},
    "confirms_agreement": {("agrees", "confirm")},
    "closes_after_confirmation": {("confirms", "close")},
    "accepts_counter": {("counter", "accept")},
    "ends_hopeless_negotiation": {("budget_below", "end")},
    "clear_actions": {None},
}


def test_skill_texts_name_their_rule_situation_and_move():
    assert set(RULE_ADVICE) == set(SKILLS)
    for rule_id, texts in SKILLS.items():
        assert {parse_guidance(text, LANGUAGE) for text in texts} <= RULE_ADVICE[rule_id], rule_id
    assert set(LANGUAGE.skill_texts) == {text for texts in SKILLS.values() for text in texts}


@pytest.mark.parametrize("rule_id", [r for r, advice in RULE_ADVICE.items() if advice != {None}])
def test_following_a_skill_passes_its_rule(rule_id):
    """Play the scripted seller on held-out tasks, but at the skill's situation say the skill's move: the rule
    passes wherever it applies (so the guidance the prior learns to read is right guidance)."""
    for situation, move in RULE_ADVICE[rule_id]:
        verdicts = []
        for task in ENV.tasks("eval"):
            episode, followed = ENV.reset(task, 0), False
            while not episode.done:
                here = situation_of(episode.observation) == situation and not followed
                action = move if here else scripted_policy(episode.observation)
                followed = followed or here
                episode = ENV.step(episode, action)
            if followed:
                verdicts.append(RULES_BY_ID[rule_id].check(episode.state)[0])
        assert verdicts and all(v in (True, None) for v in verdicts) and True in verdicts, (rule_id, situation)


# -- the corpus ---------------------------------------------------------------------------------------------


def test_examples_are_deterministic_and_depend_on_the_seed():
    first, again = example(7), example(7)
    assert first.token_ids == again.token_ids and first.targets == again.targets
    other = example(7, CorpusSpec(seed=1))
    assert (other.token_ids, other.lines) != (first.token_ids, first.lines)


def test_lines_are_what_they_say_and_never_a_skill_text_or_a_heldout_pairing(corpus):
    skills = set(LANGUAGE.skill_texts)
    lines = [line for ex in corpus for line in ex.lines]
    assert len(lines) > 10000
    for situation, move, text in lines:
        assert parse_guidance(text, LANGUAGE) == (situation, move)
        assert text not in skills and (situation, move) not in HELDOUT
    for ex in corpus:
        assert len({s for s, _, _ in ex.lines}) == len(ex.lines)  # no situation named twice
        texts = [t for _, _, t in ex.lines]
        assert ex.system_prompt == render_system_prompt(ENV.system_prompt, texts)


def test_pairings_are_uniform(corpus):
    """Within each situation, the lines' moves are uniform over the moves not held out for it (chi-square at
    p = 0.001, CHI2_001 by degrees of freedom)."""
    counts = Counter((s, m) for ex in corpus for s, m, _ in ex.lines)
    for situation in GUIDANCE_SITUATIONS:
        moves = [m for m in LANGUAGE.actions if (situation.name, m) not in HELDOUT]
        observed = [counts[(situation.name, m)] for m in moves]
        expected = sum(observed) / len(moves)
        chi2 = sum((o - expected) ** 2 / expected for o in observed)
        assert chi2 < CHI2_001[len(moves) - 1], (situation.name, observed)


def test_targets_follow_the_line_naming_the_situation_else_uniform(corpus):
    guided = unguided = 0
    for ex in corpus:
        named = {s: m for s, m, _ in ex.lines}
        assert len(ex.positions) == len(ex.targets) == len(ex.moves) == len(ex.situations) >= 1
        assert len(ex.token_ids) <= SPEC.max_length
        for position, target, move, situation in zip(ex.positions, ex.targets, ex.moves, ex.situations):
            assert CODEC.words[ex.token_ids[position + 1]] == move  # the move follows the cue
            if situation in named:
                assert LANGUAGE.actions[target] == named[situation] == move
                guided += 1
            else:
                assert target == -1
                unguided += 1
    assert guided > 2000 and unguided > 2000
    assert 0.7 < sum(bool(ex.lines) for ex in corpus) / len(corpus) < 0.9  # guided_share 0.8


def test_unguided_moves_are_uniform(corpus):
    counts = Counter(m for ex in corpus for t, m in zip(ex.targets, ex.moves) if t == -1)
    expected = sum(counts.values()) / len(LANGUAGE.actions)
    assert sum((counts[m] - expected) ** 2 / expected for m in LANGUAGE.actions) < CHI2_001[7]


def test_corpus_moves_win_heldout_tasks_no_more_often_than_random_moves(corpus):
    """Each example replayed as a fixed move sequence on the held-out tasks its first observation could open
    (the same opening situation): its win rate is at most that of uniformly random moves of the same length
    (averaged over 20 draws per example) plus three standard errors."""
    openings = {}
    for task in ENV.tasks("eval"):
        openings.setdefault(situation_of(ENV.reset(task, 0).observation), []).append(task)

    def wins(task, moves):
        episode = ENV.reset(task, 0)
        for move in moves:
            if episode.done:
                break
            episode = ENV.step(episode, move)
        return ENV.outcome(episode).success

    rng = random.Random(3)
    corpus_wins = random_wins = trials = 0
    for ex in corpus:
        for task in openings.get(ex.situations[0], [])[:8]:
            corpus_wins += wins(task, ex.moves)
            random_wins += sum(wins(task, rng.choices(LANGUAGE.actions, k=len(ex.moves))) for _ in range(20)) / 20
            trials += 1
    assert trials > 5000
    chance = random_wins / trials
    assert corpus_wins / trials <= chance + 3 * (max(chance, 1 / trials) / trials) ** 0.5


def test_encode_conversation_is_how_rollouts_encode_an_episode():
    """An independent encoding: a rollout of the built-in policy (rwcore.trainer.rollout.run_episodes) over
    real episodes gives the same token ids as encode_conversation of its observations and moves."""
    import torch

    from rwcore.trainer.policy import Policy, build_model
    from rwcore.trainer.rollout import run_episodes

    torch.manual_seed(0)
    model = build_model(len(CODEC), 16, 1, 2, 32, 256, 0, True)
    policy = Policy(model, CODEC, torch.device("cpu"))
    policy.restrict([CODEC.vocab[a] for a in LANGUAGE.actions])  # every message one move word
    system = render_system_prompt(ENV.system_prompt, ["when the buyer agrees say confirm"])
    jobs = [(task, 3, f"g{i}") for i, task in enumerate(ENV.tasks("eval")[:6])]
    for rollout in run_episodes(ENV, policy, jobs, system, 1.0, 1):
        turns = rollout.trajectory.turns
        observations = [t.content for t in turns if t.role == "partner"]
        moves = [t.content for t in turns if t.role == "assistant"]
        assert len(observations) == len(moves)  # the episode ended after the last move
        ids, positions = encode_conversation(CODEC, system, observations, moves)
        assert rollout.token_ids[-1] == CODEC.end_id
        assert ids == rollout.token_ids[:-1]  # up to the last move: the <end> closing it is left out
        assert [p + 1 for p in positions] == [t for t, generated in enumerate(rollout.generated) if generated]
        # and up to the next cue, as the probe asks: the conversation before the last move
        ids, positions = encode_conversation(CODEC, system, observations, moves[:-1])
        assert ids == rollout.token_ids[: positions[-1] + 1] and ids[-1] == CODEC.vocab["<assistant>"]
