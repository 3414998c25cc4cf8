"""The built-in negotiation environment ("negotiation"): the embedded default's task family.

`NegotiationEnv` is its learnable tier (`env.options.difficulty=learnable`, the default), where outcome-only RL
finds sales by exploring; `HardNegotiationEnv` is the hard tier (`difficulty=hard`: multi-item sales, the papers'
regime), built from the same sales. This docstring holds the rules of a sale; the hard tier's are in `hard`.

The agent is a seller facing a scripted, seeded buyer, in the spirit of the RewardWeaver Sales
Benchmark (the RewardWeaver paper, appendix B: elicit the buyer's constraint before proposing;
standard vs constraint-conflict tasks) and of Arise's sparse-outcome agent tasks (the Arise paper,
§1: a success needs a sequence of distinct behaviours, so a random policy almost never succeeds
and outcome-only GRPO sees mostly all-failure groups). Everything is said in a small word-level
language so a tiny transformer can learn it with RL on a CPU in minutes.

Language
--------
Agent messages (one word per turn; parsing is lenient, see `parse_action`):

    ask       ask the buyer's budget (its constraint; an honest buyer states it)
    match     offer the buyer's latest number: its counter-offer, else the budget it stated for what is on
              the table (the bundle budget once the bundle is proposed); with no number stated it is unclear
    list      offer the list price
    N         offer at price N (N in 20, 40, ..., 200; "offer N" says the same)
    bundle    propose the item plus an accessory: later prices are the bundle's ("bundle N" offers it at N)
    accept    accept the buyer's counter-offer
    confirm   confirm the price the buyer agreed to
    close     close the confirmed deal
    end       end the negotiation without a deal

The built-in policy samples the eight words (`VERB_PHRASES`; `price_words=True` adds the ten price
numbers, `ACTION_PHRASES`). Observations restate the seller's private facts, then the buyer's
message; every buyer number is followed by `above` or `below` (is it at least the cost of what it
is for?), so a small model need not compare two number tokens:

    item lamp cost 60 list 120 buyer wants item
    item lamp cost 60 list 120 buyer budget 100 above
    item lamp cost 60 bundle cost 80 list 120 buyer budget 40 below bundle budget 120 above
    item lamp cost 60 bundle cost 80 list 120 buyer likes bundle budget 120 above
    item lamp cost 60 list 120 buyer too high offer 100 above   (a haggler's counter)
    item lamp cost 60 list 120 buyer agrees 100 above           (then: confirm)
    item lamp cost 60 list 120 buyer confirms                   (then: close)
    item lamp cost 60 list 120 deal 100 above                   (episode over)

A deal takes three steps once the price is right: the buyer agrees (to an offer at or below its
budget, or to `accept` after its counter), the seller confirms, the seller closes. The buyer is
impatient - it leaves at a price named before the seller asked its budget (`buyer not interested
leaves`; a haggler and a buyer who asked for a price need no asking), at the first offer it refuses
(`buyer too high leaves`, `buyer wants bundle leaves` for a plain offer to a bundle buyer) and at
the first unparsable or out-of-place message (`buyer leaves`: asking twice, `match` with no number
stated, accepting with no counter, a bundle nobody wants or proposed twice, a repeated offer,
confirming or closing out of turn, anything but `confirm` / `end` after an agreement, anything but
`close` / `end` after the confirmation). A haggler says `buyer secret` when asked, and never takes a
first offer: it counters at its budget (`buyer too high offer N`) an offer up to 20 above it, leaves
when insulted by more (`buyer leaves`), and counters 20 lower than a price it could have paid; after
its counter it takes `accept` or any offer up to the counter. A buyer who asks for a price (`buyer
wants price`) also says `buyer secret` when asked, and takes the list price, which is its budget.
Other messages: `buyer changed mind leaves` (a hostile buyer, at the moment it would agree), `item
sold out` (the scenario, at the moment of closing), `no deal` (after `end`), ` time up` at max_turns
(6). `step` never mutates the Episode it is given.

Task types (Task.tags); every split holds them in fixed proportions (`KIND_WEIGHTS`)
--------------------------------------------------------------------------------------
standard         honest buyer, budget 20-40 above cost: ask, match (or the budget), confirm, close.
bundle           the buyer only buys the bundle (bundle cost = item cost + 20); its plain budget is below
                 the item cost: ask, bundle, match (or the bundle budget), confirm, close.
haggler          keeps its budget secret: open at the list price (20 above the budget, which draws the
                 counter), accept (or match), confirm, close.
quote            asks for a price: list, confirm, close.
no_deal          the budget is below cost: the right outcome is no deal - ask, then end at once.
hostile_partner  walks out at the moment it would agree, whatever the seller did: unwinnable, and the
                 failure is the partner's (`task.data["winnable"]` False; the attributor says "partner").
sold_out         the item turns out to be sold out at the moment of closing: unwinnable, the scenario's.

Every winnable type needs a different sequence and none is more than 15% of a split, so no fixed
sequence of messages wins more than one type: the best fixed sequence wins 0.150 of the held-out
tasks (the haggler tasks), a uniformly random policy 0.0021 in expectation, and a policy that plays every type
right 0.740 (26% of the tasks cannot be won).

Outcome (sparse)
----------------
success: a closed deal of what the buyer wanted at exactly the buyer's budget for it (at least its
cost; money left on the table is no success), or, on a no_deal task, `end` right after the buyer
stated its budget. reward = 1.0 on success, 0.0 otherwise.

Policies and measured rates
---------------------------
`scripted_policy(observation)` plays every type as described above; `random_policy(observation,
rng)` picks a uniform verb and price. `evaluate_policy(env, policy, split, seeds)` measures them
and `best_fixed_sequence(env)` searches every fixed message sequence (the same messages whatever
the buyer says) for the best held-out success. `python -m rwcore.trainer.envs.negotiation` prints
all three.

Guidance language
-----------------
`guidance_language()` says how guidance in the policy's prompt talks about this environment: thirteen
situations (`GUIDANCE_SITUATIONS`, one per kind of buyer message an agent turn follows: the buyer wants the
item, agrees, confirms, says too high, ...), the phrases a guidance line names each by ("the buyer agrees"),
`observe_situation` (an observation showing one, no episode behind it) and `situation_of` (the situation an
observation shows). The built-in model's reading prior is pretrained on lines over this language with moves
drawn at random (rwcore.trainer.prior); the skill texts of `rubrics` use the same phrases.

Trajectory contract (what the rubric checks read)
--------------------------------------------------
`build_trajectory` makes the Trajectory the trainer must build the same way:
turns = [system(system prompt + skills), partner(first observation), then alternately
assistant(agent message, generated=True) and partner(reply)], outcome = Outcome.reward,
tags = task.tags, metadata = {"env_state": episode.state, "task": task.data,
"task_id": task.task_id, "seed": the reset seed, "success": Outcome.success}. Rules read
metadata["env_state"] (the finished Episode.state, copied as is); when it is missing they
replay the episode from metadata["task"], metadata["task_id"] (else trajectory.task_id),
metadata["seed"] (else 0) and the assistant turns; when both are missing they raise
(RuleJudge: INVALID).

Modules
-------
language            the move words, parsing a message or an observation, rendering an observation
tasks               the task kinds, their mix in a split, one task's scenario sheet (`make_task_data`)
guidance            the guidance language: situations, their phrases, observing and recognising one
environment         `NegotiationEnv`: splits, episodes, the buyer, outcomes (the learnable tier)
hard                `HardNegotiationEnv` and `make_negotiation` (`env.name=negotiation`, either tier)
trajectories        `build_trajectory` (the contract above) and `run_episode`
reference_policies  the scripted, random and deliberately bad policies; `evaluate_policy`
search              `best_fixed_sequence`: the best message sequence that ignores the buyer
rubrics             the rule library (checks, skill texts, the initial library) over either tier's episodes
reflector           the rule reflector (Arise reflection, RewardWeaver proposals) without an LLM
attributor          the failure attributor without an LLM, and who controlled a failure (`failure_cause`)
cases               labelled cases for admitting a rule, labelled by `annotator`
annotator           reference labels from the transcript and the scenario sheet alone
"""

from rwcore.trainer.envs.base import register
from rwcore.trainer.envs.negotiation.environment import NegotiationEnv
from rwcore.trainer.envs.negotiation.guidance import GUIDANCE_SITUATIONS, observe_situation, situation_of
from rwcore.trainer.envs.negotiation.hard import DIFFICULTIES, HARD_KINDS, HardNegotiationEnv, make_negotiation
from rwcore.trainer.envs.negotiation.language import (
    ACTION_PHRASES,
    PRICES,
    VERB_PHRASES,
    is_offer,
    parse_action,
    parse_observation,
)
from rwcore.trainer.envs.negotiation.reference_policies import evaluate_policy, random_policy, scripted_policy
from rwcore.trainer.envs.negotiation.search import best_fixed_sequence
from rwcore.trainer.envs.negotiation.tasks import KIND_WEIGHTS, KINDS
from rwcore.trainer.envs.negotiation.trajectories import build_trajectory, run_episode

__all__ = [
    "ACTION_PHRASES",
    "DIFFICULTIES",
    "GUIDANCE_SITUATIONS",
    "HARD_KINDS",
    "KINDS",
    "KIND_WEIGHTS",
    "PRICES",
    "VERB_PHRASES",
    "HardNegotiationEnv",
    "NegotiationEnv",
    "best_fixed_sequence",
    "build_trajectory",
    "evaluate_policy",
    "is_offer",
    "make_negotiation",
    "observe_situation",
    "parse_action",
    "parse_observation",
    "random_policy",
    "run_episode",
    "scripted_policy",
    "situation_of",
]

# env.options.difficulty=learnable (NegotiationEnv, the embedded default) | hard (HardNegotiationEnv)
register("negotiation", make_negotiation)
