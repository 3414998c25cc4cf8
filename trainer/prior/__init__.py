"""The built-in model's reading prior: a small instruction follower built locally.

The papers train instruction-following models that read the skills Arise puts in their prompt. The built-in
model starts from random weights, so by default (`model.init=pretrained`) it is first pretrained on a
synthetic corpus that teaches it to follow guidance lines ("when the buyer agrees say confirm") with moves
drawn at random - reading, not the task (`corpus`, `pretrain`); the priors of the embedded default's tiers ship
with the package (`shipped`), others are built and cached per machine (`cache`), and
`probe` measures that it reads. `rw pretrain` builds it and prints the probe; `rw probe` probes any
checkpoint; `rw train` takes the probe's light mode at every held-out evaluation (`train.probe_at_eval`), and
`loss.reading_retention` (off by default) keeps the prior's reading under RL (`retention`).
"""

from __future__ import annotations

from rwcore.trainer.prior.cache import Prior, PriorCacheError, cache_folder, ensure_prior, prior_record
from rwcore.trainer.prior.corpus import CorpusSpec, heldout_pairs, parse_guidance
from rwcore.trainer.prior.pretrain import language_of, prior_spec

__all__ = [
    "CorpusSpec",
    "Prior",
    "PriorCacheError",
    "cache_folder",
    "ensure_prior",
    "heldout_pairs",
    "language_of",
    "parse_guidance",
    "prior_record",
    "prior_spec",
    "resolve_init",
    "resolve_probe_at_eval",
]


def resolve_init(config, env) -> str | None:
    """model.init as a run uses it: None for a named model (its own weights), else "pretrained" or "random"
    (unset: pretrained where the environment has a guidance language). Raises ValueError naming model.init
    when pretrained is asked for on an environment without one."""
    if config.model.name:
        return None
    wanted = config.model.init
    has_language = language_of(env) is not None
    if wanted == "pretrained" and not has_language:
        raise ValueError(
            f"config key 'model.init': pretrained needs an environment with a guidance language to "
            f"pretrain the reading prior on; env.name={env.name!r} has none (use model.init=random)"
        )
    if wanted is None:
        return "pretrained" if has_language else "random"
    return wanted


def resolve_probe_at_eval(config, env) -> bool:
    """Whether a run takes the light probe at every held-out evaluation (train.probe_at_eval; auto: for the
    built-in model on an environment with a guidance language). Raises ValueError naming
    train.probe_at_eval when on is asked for a named model or an environment without one."""
    wanted = config.train.probe_at_eval
    if wanted == "off":
        return False
    possible = not config.model.name and language_of(env) is not None
    if wanted == "on" and not possible:
        reason = (
            f"model.name={config.model.name!r} is not the built-in model"
            if config.model.name
            else f"env.name={env.name!r} has no guidance language"
        )
        raise ValueError(
            f"config key 'train.probe_at_eval': on needs the built-in model on an environment with a guidance "
            f"language; {reason} (use auto or off)"
        )
    return possible
