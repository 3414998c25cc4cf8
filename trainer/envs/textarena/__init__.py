"""`env.name=textarena`: TextArena's two-player text games (https://github.com/LeonGuertler/TextArena) as
an `rw train` environment. Needs the optional `textarena` package (tested with 0.7.4):
`pip install 'rwcore[textarena]'`; without it, building the environment raises ImportError naming the extra.

Games (env.options.games: families or TextArena ids; default both families)
----------------------------------------------------------------------------
simple_negotiation    SimpleNegotiation-v0-short / -v0 / -v0-long (6 / 10 / 30 turns in all): each side holds
                      5-25 of Wheat, Wood, Sheep, Brick, Ore with private values; moves are free text with
                      `[Offer: 2 Wood -> 1 Ore]`, `[Accept]`, `[Deny]`. Roles: first, second (who moves first).
truth_and_deception   TruthAndDeception-v0 / -v0-long (6 / 12 turns): two facts, one true. Roles: deceiver
                      (knows which is true, must make the guesser pick the wrong one), guesser (talks, then
                      answers `[Fact 1]` or `[Fact 2]` on its last turn).

Not supported in TextArena 0.7.4: `Negotiation-v0` is not registered there, and `UsedCarNegotiation-v0`'s
instruction files are missing from the wheel (it fails at reset). Other two-player games can be added to
`games.GAMES` with a scripted opponent.

Tasks, tags and splits
----------------------
A task is (TextArena id, the agent's role, a game seed); its tags are the family, `family/role` and
`family/variant` (the sampler's task types). `num_train` / `num_eval` tasks (64 / 16), cycling over every
(variant, role); seeds are drawn from env.options.seed and the splits never share a game instance (for
truth_and_deception: never the same pair of facts). The game itself is TextArena's code; reset's `seed`
only drives the opponent's randomness.

Opponents (env.options.opponent)
--------------------------------
scripted   (default) a rule-based player per game. simple_negotiation: accepts an offer that raises its
           own inventory value, denies anything else and proposes a trade that gains it value (2-3 of its
           cheapest resource for one dearer one). truth_and_deception: the deceiver always argues for the
           wrong fact; the guesser asks, then picks the fact it was told last.
llm        a model over an OpenAI-compatible chat API sees TextArena's own prompt for its side and the game
           so far (env.options.partner_model, partner_base_url, partner_api_key_env - the NAME of the
           variable holding the key - partner_timeout, partner_max_tokens, partner_temperature); all live
           episodes' requests of a turn go out together. A request that fails or times out after retries,
           or two invalid opponent moves in a row, end the episode as a partner failure (not charged to the
           agent).
self       self-play: the policy being trained writes the opponent's moves from the same view an LLM
           opponent gets (the trainer attaches it through `attach_policy`; no loss flows through them).

Outcome and success
-------------------
TextArena's reward for the agent's side, r in {-1, 0, 1}, becomes reward (r + 1) / 2: win 1.0, draw 0.5,
loss 0.0 (two invalid moves in a row lose the game, as in TextArena). success = a win. SimpleNegotiation
is won by the larger gain in inventory value at the turn limit (no trade: a draw); TruthAndDeception by
the guesser naming the true fact (else the deceiver wins).

Rubric families (programmatic rules for judge.kind=rule; with judge.kind=openai the LLM judge,
reflector and attributor fill in everything else)
--------------------------------------------------------------------------------------------------
format        ta_valid_moves (every move valid, Execution), ta_guess_format (guesser answers [Fact N])
negotiation   ta_offer_made (a well-formed offer, Execution), ta_profitable_trades (every executed trade
              raised the agent's own inventory value, Verification)
deception     ta_deceiver_consistent (the deceiver only ever points to the wrong fact, Understanding)
The environment also brings a rule reflector and attributor (rwcore.trainer.envs.rule_providers over the
rules and skill texts of rubrics.py) and labelled cases (rubrics.py) for RewardWeaver's source-disjoint
acceptance test: per rule, games against the scripted opponent (12 game
instances of their own seed stream, never train or eval tasks) played once with agent moves that make the
rule pass and once with moves that make it fail, by construction.
"""

from rwcore.trainer.envs.base import register
from rwcore.trainer.envs.textarena.adapter import INSTALL_HINT, TextArenaEnv
from rwcore.trainer.envs.textarena.games import GAMES

register("textarena", TextArenaEnv)

__all__ = ["GAMES", "INSTALL_HINT", "TextArenaEnv"]
