"""The skill-reading probe at every held-out evaluation of `rw train` (train.probe_at_eval) and its light mode.

- The light mode is the full probe restricted to a subset of its contexts, with the same definitions: its
  figures are recomputed here from the policy's move probabilities (`_probabilities`) on the contexts the
  full probe draws (the first 6 of each held-out pairing and of each situation's episodes, the first skill
  text of each situation -> move pairing, parsed here), never from the light mode's own code path.
- The probe leaves every global random state and the model's mode as it found them.
- The eval rows hold eval/probe/* exactly when the probe runs (auto: the built-in model on an environment
  with a guidance language); on is refused, naming the key, where it cannot run.
- A tiny run gives the same values for every other metric with the probe on and off, and the same weights.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from _util import TINY_MODEL, TINY_PRIOR, metrics_rows

from rwcore.arise.pool.prompt import render_system_prompt
from rwcore.trainer import envs
from rwcore.trainer.config import load_config
from rwcore.trainer.policy import WordCodec, build_model
from rwcore.trainer.prior import parse_guidance, resolve_probe_at_eval
from rwcore.trainer.prior.corpus import CorpusSpec
from rwcore.trainer.prior.probe import (
    CONTEXTS_PER_PAIR,
    EvaluationProbe,
    _probabilities,
    episode_contexts,
    heldout_contexts,
    probe,
)
from rwcore.trainer.trainer import Trainer

ENV = envs.make("negotiation")
LANGUAGE = ENV.guidance_language()
CODEC = WordCodec(ENV.vocabulary())
SPEC = CorpusSpec()
ACTIONS = list(LANGUAGE.actions)
LIGHT = 6

TINY_RUN = [
    "env.options.num_train=24",
    "env.options.num_eval=6",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "train.eval_every=2",
    "train.checkpoint_every=2",
    "train.steps=4",
    "pool.delta_pool=1",
    "rewardweaver.adaptation_interval=2",
    "rewardweaver.diagnosis_tasks=2",
    "rewardweaver.diagnostic_tasks=2",
    "rewardweaver.min_support=1",
]
PROBE_KEYS = {
    "eval/probe/heldout_with",
    "eval/probe/heldout_without",
    "eval/probe/skill_lift_mean",
    "eval/probe/skill_lift_min",
}


def tiny_model(seed: int = 3):
    """A random 1-layer model whose move probabilities differ from context to context (checked below)."""
    model = build_model(len(CODEC), 16, 1, 2, 32, 256, seed, True, None)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0)  # sharper than the default init: the contexts' probabilities spread out
    return model


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def contexts():
    return episode_contexts(ENV, LANGUAGE)


def test_light_heldout_figures_are_the_full_probe_on_its_first_contexts(model, contexts):
    full_contexts = heldout_contexts(ENV, LANGUAGE, SPEC)
    assert len(full_contexts) == 12 * CONTEXTS_PER_PAIR
    # a smaller per_pair keeps a prefix of every pairing's contexts
    short = heldout_contexts(ENV, LANGUAGE, SPEC, per_pair=LIGHT)
    assert short == [c for k, c in enumerate(full_contexts) if k % CONTEXTS_PER_PAIR < LIGHT]
    guided = _probabilities(model, CODEC, [c.guided for c in full_contexts], ACTIONS, SPEC.max_length)
    bare = _probabilities(model, CODEC, [c.bare for c in full_contexts], ACTIONS, SPEC.max_length)
    hinted_with = [float(guided[k, ACTIONS.index(c.move)]) for k, c in enumerate(full_contexts)]
    hinted_without = [float(bare[k, ACTIONS.index(c.move)]) for k, c in enumerate(full_contexts)]
    assert np.std(hinted_with) > 1e-3  # the contexts differ: a wrong subset would change the figures

    def per_pair_mean(values, first):
        blocks = [values[i : i + CONTEXTS_PER_PAIR][:first] for i in range(0, len(values), CONTEXTS_PER_PAIR)]
        return mean(mean(block) for block in blocks)

    full = probe(model, CODEC, ENV, LANGUAGE, SPEC, contexts=contexts)
    light = probe(model, CODEC, ENV, LANGUAGE, SPEC, light=True, contexts=contexts)
    assert full["mode"] == "full" and light["mode"] == "light"
    assert full["heldout"]["with"] == pytest.approx(per_pair_mean(hinted_with, CONTEXTS_PER_PAIR), abs=1e-6)
    assert full["heldout"]["without"] == pytest.approx(per_pair_mean(hinted_without, CONTEXTS_PER_PAIR), abs=1e-6)
    assert light["heldout"]["with"] == pytest.approx(per_pair_mean(hinted_with, LIGHT), abs=1e-6)
    assert light["heldout"]["without"] == pytest.approx(per_pair_mean(hinted_without, LIGHT), abs=1e-6)
    assert light["heldout"]["contexts_per_pair"] == LIGHT and "distractors_only" not in light["heldout"]
    assert abs(light["heldout"]["with"] - full["heldout"]["with"]) > 1e-4  # the subset is not the whole


def test_light_skill_lifts_are_the_full_probe_on_first_texts_and_first_contexts(model, contexts):
    firsts, seen = [], set()
    for text in LANGUAGE.skill_texts:
        pair = parse_guidance(text, LANGUAGE)
        if pair is not None and pair not in seen:
            seen.add(pair)
            firsts.append((text, *pair))
    assert len(firsts) < 30  # fewer texts than the full probe's

    def lifts(first):
        found = {}
        for text, situation, move in firsts:
            shown = contexts[situation][:first]
            base = ENV.system_prompt
            guided = _probabilities(
                model, CODEC, [(render_system_prompt(base, [text]), o, m) for o, m in shown], ACTIONS, SPEC.max_length
            )
            bare = _probabilities(model, CODEC, [(base, o, m) for o, m in shown], ACTIONS, SPEC.max_length)
            column = ACTIONS.index(move)
            found[text] = float(guided[:, column].mean() - bare[:, column].mean())
        return found

    expected_light, expected_full = lifts(LIGHT), lifts(None)
    light = probe(model, CODEC, ENV, LANGUAGE, SPEC, light=True, contexts=contexts)
    full = probe(model, CODEC, ENV, LANGUAGE, SPEC, contexts=contexts)
    light_skills = {s["text"]: s for s in light["skills"] if s["probed"]}
    assert set(light_skills) == {text for text, _, _ in firsts}
    for text, lift in expected_light.items():
        assert light_skills[text]["lift"] == pytest.approx(lift, abs=1e-6)
        assert light_skills[text]["contexts"] == min(LIGHT, len(contexts[light_skills[text]["situation"]]))
    full_skills = {s["text"]: s for s in full["skills"] if s["probed"]}
    for text, lift in expected_full.items():
        assert full_skills[text]["lift"] == pytest.approx(lift, abs=1e-6)
    assert light["skills_summary"]["mean_lift"] == pytest.approx(mean(expected_light.values()), abs=1e-6)
    assert light["skills_summary"]["min_lift"] == pytest.approx(min(expected_light.values()), abs=1e-6)
    metrics = EvaluationProbe(ENV, LANGUAGE, SPEC).metrics(model, CODEC)
    assert set(metrics) == PROBE_KEYS
    assert metrics["eval/probe/skill_lift_mean"] == pytest.approx(mean(expected_light.values()), abs=1e-6)
    assert metrics["eval/probe/skill_lift_min"] == pytest.approx(min(expected_light.values()), abs=1e-6)
    assert metrics["eval/probe/heldout_with"] == pytest.approx(light["heldout"]["with"], abs=1e-9)


@pytest.mark.parametrize("training", [True, False])
def test_the_probe_leaves_random_states_and_the_model_mode_alone(model, training):
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    model.train(training)
    EvaluationProbe(ENV, LANGUAGE, SPEC).metrics(model, CODEC)
    assert model.training is training
    assert random.getstate() == states[0]
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])


def test_probe_at_eval_resolution_and_refusals():
    assert resolve_probe_at_eval(load_config(None, []), ENV) is True
    assert resolve_probe_at_eval(load_config(None, ["model.init=random"]), ENV) is True
    assert resolve_probe_at_eval(load_config(None, ["train.probe_at_eval=off"]), ENV) is False
    tools = envs.make("tools", num_train=4, num_eval=2)
    assert resolve_probe_at_eval(load_config(None, ["env.name=tools"]), tools) is False
    named = load_config(None, ["model.name=Qwen/Qwen3-0.6B"])
    assert resolve_probe_at_eval(named, ENV) is False
    with pytest.raises(ValueError, match=r"'train.probe_at_eval'.*env.name='tools' has no guidance language"):
        resolve_probe_at_eval(load_config(None, ["env.name=tools", "train.probe_at_eval=on"]), tools)
    with pytest.raises(ValueError, match=r"'train.probe_at_eval'.*not an allowed value"):
        load_config(None, ["train.probe_at_eval=always"])


def test_train_refuses_probe_on_for_a_named_model_before_writing_anything(tmp_path):
    trainer = Trainer(
        load_config(None, ["model.name=Qwen/Qwen3-0.6B", "train.probe_at_eval=on"]), tmp_path / "run", quiet=True
    )
    with pytest.raises(ValueError, match=r"'train.probe_at_eval'.*model.name='Qwen/Qwen3-0.6B'"):
        trainer.setup()  # refused before the model is loaded
    assert not (tmp_path / "run").exists()


def run(folder, *overrides) -> tuple[list[dict], dict]:
    trainer = Trainer(load_config(None, [*TINY_PRIOR, *TINY_RUN, *overrides]), folder, quiet=True)
    trainer.setup()
    trainer.train()
    weights = {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}
    trainer.cleanup()
    return metrics_rows(folder), weights


def test_probe_on_and_off_give_the_same_run(tmp_path, cache):
    """The default (auto: on for the built-in model from the prior) against off: every metric both rows
    hold is the same, the probe's keys are in the eval rows only, and the trained weights are equal."""
    on, on_weights = run(tmp_path / "on", cache)
    off, off_weights = run(tmp_path / "off", cache, "train.probe_at_eval=off")
    assert [(r["kind"], r["step"]) for r in on] == [(r["kind"], r["step"]) for r in off]
    assert [r["step"] for r in on if r["kind"] == "eval"] == [0, 2, 4]
    for with_probe, without in zip(on, off):
        shared = (set(with_probe) & set(without)) - {k for k in with_probe if k.startswith("time/")}
        assert len(shared) > 3
        assert {k: with_probe[k] for k in shared} == {k: without[k] for k in shared}
        assert not set(without) & PROBE_KEYS
        if with_probe["kind"] == "eval":
            assert set(with_probe) - set(without) == PROBE_KEYS | {"time/probe"}
            assert all(math.isfinite(with_probe[key]) and -1 <= with_probe[key] <= 1 for key in PROBE_KEYS)
        else:
            assert set(with_probe) == set(without)
    assert on_weights.keys() == off_weights.keys() and all(
        torch.equal(on_weights[k], off_weights[k]) for k in on_weights
    )
    # the probe reads the policy as it is at each evaluation: training moved its figures
    evals = [r for r in on if r["kind"] == "eval"]
    assert evals[0]["eval/probe/heldout_with"] != evals[-1]["eval/probe/heldout_with"]


def test_no_probe_keys_on_an_environment_without_a_guidance_language(tmp_path):
    trainer = Trainer(
        load_config(
            None,
            [
                *TINY_MODEL,
                "env.name=tools",
                "env.options.num_train=4",
                "env.options.num_eval=2",
                "rollout.tasks_per_step=2",
                "rollout.group_size=2",
                "train.steps=0",
                "rewardweaver.diagnosis_tasks=2",
                "rewardweaver.diagnostic_tasks=2",
                "rewardweaver.min_support=1",
            ],
        ),
        tmp_path / "tools",
        quiet=True,
    )
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    evals = [r for r in metrics_rows(tmp_path / "tools") if r["kind"] == "eval"]
    assert evals and all(not set(r) & (PROBE_KEYS | {"time/probe"}) for r in evals)
