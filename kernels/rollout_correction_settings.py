"""A rollout correction's settings: `RolloutCorrection` (which importance weight, rejection criteria and form),
verl's threshold syntax (`parse_is_threshold`, `parse_rs_thresholds`), verl's presets (`PRESETS`) and the rules
the policy losses apply before computing anything (`resolve`, `check_forms`, `ratio_bounds`).

What the settings mean, with the formulas, is in rwcore.kernels.rollout_correction, which computes the weights
and the metrics (and from which these names can be imported as well).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")
LOSS_TYPES = ("ppo_clip", "reinforce")
TOKEN_RS_OPTIONS = ("token_k1", "token_k2", "token_k3")
RS_OPTIONS = TOKEN_RS_OPTIONS + (
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


def parse_is_threshold(spec, name: str = "rollout_is_threshold") -> tuple[float | None, float, str]:
    """verl's `rollout_is_threshold`: a number is TIS's upper bound; "lower_upper" is IcePop's band.

    Returns (lower, upper, mode) with mode "truncate" or "mask"."""
    if isinstance(spec, str):
        text = spec.strip()
        if "_" in text:
            low_text, high_text = text.split("_", 1)
            try:
                low, high = float(low_text), float(high_text)
            except ValueError:
                raise ValueError(f"{name}={spec!r} is not 'lower_upper' with two numbers") from None
            low, high = _positive(low, f"{name} (lower)"), _positive(high, f"{name} (upper)")
            if low > high:
                raise ValueError(f"{name}={spec!r}: the lower bound must be <= the upper bound")
            return low, high, "mask"
        try:
            spec = float(text)
        except ValueError:
            raise ValueError(f"{name}={spec!r} is not a number or 'lower_upper'") from None
    return None, _positive(spec, name), "truncate"


def parse_rs_thresholds(options: tuple[str, ...], spec, name: str = "rollout_rs_threshold"):
    """verl's `rollout_rs_threshold`: one entry for all options or one per option, comma separated.

    k1 options take "lower_upper" ratio bounds (a single number u means 1/u_u); the others an upper
    bound only. Returns ((lower or None, upper), ...) aligned with `options`."""
    if spec is None:
        raise ValueError(f"{name} is required when rollout_rs is set ({','.join(options)})")
    if isinstance(spec, bool):
        raise ValueError(f"{name} must be a number or a string, got {spec!r}")
    parts = [str(spec)] if isinstance(spec, (int, float)) else [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(parts) not in (1, len(options)):
        raise ValueError(f"{name}={spec!r} must give one threshold for all options or one per option ({len(options)})")
    parts = parts * len(options) if len(parts) == 1 else parts
    bounds = []
    for option, part in zip(options, parts):
        where = f"{name} for {option}"
        if option.endswith("k1"):
            if "_" in part:
                low_text, high_text = part.split("_", 1)
            else:
                high_text = part
                low_text = None
            try:
                high = float(high_text)
                low = 1.0 / high if low_text is None else float(low_text)
            except (ValueError, ZeroDivisionError):
                raise ValueError(f"{where}: {part!r} is not 'lower_upper' or a number") from None
            low, high = _positive(low, f"{where} (lower)"), _positive(high, f"{where} (upper)")
            if low > high:
                raise ValueError(f"{where}: {part!r} has lower > upper")
            bounds.append((low, high))
        else:
            if "_" in part:
                raise ValueError(f"{where} takes an upper bound only, got {part!r}")
            try:
                high = float(part)
            except ValueError:
                raise ValueError(f"{where}: {part!r} is not a number") from None
            bounds.append((None, _positive(high, where)))
    return tuple(bounds)


@dataclasses.dataclass(frozen=True)
class RolloutCorrection:
    """One rollout correction (see the module docstring for the formulas).

    Attributes:
        rollout_is: importance-weight level, "token", "sequence" or None (no weight).
        is_mode: "truncate" (TIS: clamp into [is_threshold_lower, is_threshold]) or "mask" (MIS /
            IcePop: zero outside it). None bounds are open.
        is_threshold, is_threshold_lower: the bounds (ratios, > 0).
        rollout_rs: verl's rejection criteria (`RS_OPTIONS`), all of which must pass.
        rs_bounds: ((lower or None, upper), ...) per criterion, as `parse_rs_thresholds` gives them.
        bypass: no proximal log-probs (the bypass form) instead of the decoupled form.
        loss_type: bypass only: "ppo_clip" (ratio against the behaviour policy, weights for the metrics
            only) or "reinforce" (weights applied, ratio anchored at the current policy).
    """

    rollout_is: str | None = None
    is_mode: str = "truncate"
    is_threshold: float | None = 2.0
    is_threshold_lower: float | None = None
    rollout_rs: tuple[str, ...] = ()
    rs_bounds: tuple[tuple[float | None, float], ...] = ()
    bypass: bool = False
    loss_type: str = "ppo_clip"

    def __post_init__(self) -> None:
        if self.rollout_is is not None and self.rollout_is not in IS_LEVELS:
            raise ValueError(f"rollout_is must be one of {IS_LEVELS} or None, got {self.rollout_is!r}")
        if self.is_mode not in IS_MODES:
            raise ValueError(f"is_mode must be one of {IS_MODES}, got {self.is_mode!r}")
        for name in ("is_threshold", "is_threshold_lower"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _positive(getattr(self, name), name))
        if self.is_threshold is not None and self.is_threshold_lower is not None:
            if self.is_threshold_lower > self.is_threshold:
                raise ValueError(
                    f"is_threshold_lower={self.is_threshold_lower} must be <= is_threshold={self.is_threshold}"
                )
        rs = tuple(self.rollout_rs)
        unknown = [o for o in rs if o not in RS_OPTIONS]
        if unknown:
            raise ValueError(f"rollout_rs has unknown criteria {unknown}; choose from {list(RS_OPTIONS)}")
        if len(set(rs)) != len(rs):
            raise ValueError(f"rollout_rs names a criterion twice: {list(rs)}")
        if len(self.rs_bounds) != len(rs):
            raise ValueError(f"rs_bounds needs one (lower, upper) per rollout_rs criterion ({len(rs)})")
        object.__setattr__(self, "rollout_rs", rs)
        object.__setattr__(self, "rs_bounds", tuple(tuple(b) for b in self.rs_bounds))
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.loss_type == "reinforce" and not self.bypass:
            raise ValueError(
                "loss_type='reinforce' is the bypass form's: set bypass=True (or use loss_type='ppo_clip')"
            )

    @classmethod
    def from_verl(
        cls,
        rollout_is: str | None = None,
        rollout_is_threshold=2.0,
        rollout_rs=None,
        rollout_rs_threshold=None,
        bypass_mode: bool = False,
        loss_type: str = "ppo_clip",
        rollout_is_batch_normalize: bool = False,
        **unused,
    ) -> RolloutCorrection | None:
        """From verl's `RolloutCorrectionConfig` fields (verl 0.9.1); None when it corrects nothing."""
        if rollout_is_batch_normalize:
            raise ValueError("rollout_is_batch_normalize=True is not supported by rwcore's fused loss")
        options: tuple[str, ...] = ()
        if rollout_rs is not None:
            if not isinstance(rollout_rs, str):
                raise ValueError(f"rollout_rs must be a comma-separated string, got {rollout_rs!r}")
            options = tuple(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
            if not options:
                raise ValueError("rollout_rs is empty")
        lower, upper, mode = (None, 2.0, "truncate")
        if rollout_is is not None:
            if rollout_is_threshold is None:
                raise ValueError("rollout_is_threshold is required when rollout_is is set")
            lower, upper, mode = parse_is_threshold(rollout_is_threshold)
        elif rollout_is_threshold is not None:
            try:
                lower, upper, mode = parse_is_threshold(rollout_is_threshold)
            except ValueError:
                pass  # verl ignores the threshold when rollout_is is None
        bounds = parse_rs_thresholds(options, rollout_rs_threshold) if options else ()
        if rollout_is is None and not options and not bypass_mode:
            return None
        return cls(rollout_is, mode, upper, lower, options, bounds, bool(bypass_mode), loss_type)

    @classmethod
    def from_config(cls, config) -> RolloutCorrection | None:
        """From a verl `RolloutCorrectionConfig`, a DictConfig or a mapping with its keys."""
        if config is None:
            return None
        if not isinstance(config, Mapping):
            keys = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs")
            keys += ("rollout_rs_threshold", "bypass_mode", "loss_type")
            config = {k: getattr(config, k) for k in keys if hasattr(config, k)}
        return cls.from_verl(**dict(config))

    @classmethod
    def preset(cls, name: str, is_threshold=None, rs_threshold=None) -> RolloutCorrection | None:
        """A preset by verl's name (`PRESETS`; "off" is None), thresholds optionally overridden in verl's syntax."""
        if name not in PRESETS:
            raise ValueError(f"unknown rollout correction {name!r}; choose from {sorted(PRESETS)}")
        settings = dict(PRESETS[name])
        if (
            settings.get("rollout_is") is None
            and settings.get("rollout_rs") is None
            and not settings.get("bypass_mode")
        ):
            return None
        if is_threshold is not None:
            if settings.get("rollout_is") is None:
                raise ValueError(f"rollout correction {name!r} has no importance weight: drop rollout_is_threshold")
            settings["rollout_is_threshold"] = is_threshold
        if rs_threshold is not None:
            if settings.get("rollout_rs") is None:
                raise ValueError(f"rollout correction {name!r} has no rejection: drop rollout_rs_threshold")
            settings["rollout_rs_threshold"] = rs_threshold
        return cls.from_verl(**settings)

    @property
    def needs_sequences(self) -> bool:
        """Whether a sequence-level quantity is involved (weights or rejection)."""
        return self.rollout_is == "sequence" or any(o not in TOKEN_RS_OPTIONS for o in self.rollout_rs)

    @property
    def applies_weights(self) -> bool:
        """Whether the importance weight multiplies the loss (not bypass + ppo_clip, where it is only measured)."""
        return self.rollout_is is not None and not (self.bypass and self.loss_type == "ppo_clip")


def _verl(rollout_is=None, threshold=2.0, rs=None, rs_threshold=None, bypass=False, loss_type="ppo_clip") -> dict:
    return {
        "rollout_is": rollout_is,
        "rollout_is_threshold": threshold,
        "rollout_rs": rs,
        "rollout_rs_threshold": rs_threshold,
        "bypass_mode": bypass,
        "loss_type": loss_type,
    }


_GEO = "0.999_1.001"
# verl 0.9.1's RolloutCorrectionConfig presets with their default thresholds; "decoupled_seq_mis" and
# "decoupled_token_mis" are rwcore's names for sequence / token masked IS (TRL's sequence_mask / token_mask).
PRESETS: dict[str, dict] = {
    "off": _verl(),
    "decoupled_token_is": _verl("token", 2.0),
    "decoupled_seq_is": _verl("sequence", 2.0),
    "decoupled_token_icepop": _verl("token", "0.5_5.0"),
    "decoupled_token_mis": _verl("token", "0.5_2.0"),
    "decoupled_seq_mis": _verl("sequence", "0.5_2.0"),
    "decoupled_seq_is_rs": _verl("sequence", 2.0, "seq_sum_k1", "0.5_2.0"),
    "decoupled_geo_rs": _verl(None, 2.0, "seq_mean_k1", _GEO),
    "decoupled_geo_rs_seq_tis": _verl("sequence", 2.0, "seq_mean_k1", _GEO),
    "decoupled_geo_rs_token_tis": _verl("token", 2.0, "seq_mean_k1", _GEO),
    "decoupled_k3_rs": _verl(None, 2.0, "seq_mean_k3", 0.01),
    "decoupled_k3_rs_seq_tis": _verl("sequence", 2.0, "seq_mean_k3", 0.01),
    "decoupled_k3_rs_token_tis": _verl("token", 2.0, "seq_mean_k3", 0.01),
    "bypass_ppo_clip": _verl(None, 2.0, None, None, True),
    "bypass_ppo_clip_geo_rs": _verl(None, 2.0, "seq_mean_k1", _GEO, True),
    "bypass_ppo_clip_k3_rs": _verl(None, 2.0, "seq_mean_k3", 0.01, True),
    "bypass_pg_is": _verl("sequence", 2.0, None, None, True, "reinforce"),
    "bypass_pg_token_icepop": _verl("token", "0.5_5.0", None, None, True, "reinforce"),
    "bypass_pg_geo_rs": _verl(None, 2.0, "seq_mean_k1", _GEO, True, "reinforce"),
    "bypass_pg_geo_rs_seq_tis": _verl("sequence", 2.0, "seq_mean_k1", _GEO, True, "reinforce"),
    "bypass_pg_geo_rs_token_tis": _verl("token", 2.0, "seq_mean_k1", _GEO, True, "reinforce"),
}


def resolve(rollout_correction) -> RolloutCorrection | None:
    """None, a `RolloutCorrection`, a preset name, or a mapping of verl's fields -> the correction (or None)."""
    if rollout_correction is None or isinstance(rollout_correction, RolloutCorrection):
        return rollout_correction
    if isinstance(rollout_correction, str):
        return RolloutCorrection.preset(rollout_correction)
    if isinstance(rollout_correction, Mapping):
        return RolloutCorrection.from_verl(**dict(rollout_correction))
    raise ValueError(
        "rollout_correction must be None, a RolloutCorrection, a preset name or a mapping of verl's "
        f"rollout_correction fields, got {type(rollout_correction).__name__}"
    )


REINFORCE_BOUNDS = (0.0, 2.0)  # the ratio filter the REINFORCE form runs with: ratio 1 always inside


def ratio_bounds(correction: RolloutCorrection | None, ratio_low: float, ratio_high: float) -> tuple[float, float]:
    """The filter bounds the loss runs with: the caller's, or in the REINFORCE bypass form (ratio 1 by
    construction) bounds that keep every token, whatever the caller's."""
    if correction is not None and correction.bypass and correction.loss_type == "reinforce":
        return REINFORCE_BOUNDS
    return ratio_low, ratio_high


def check_forms(correction: RolloutCorrection | None, proximal_logprobs, has_sequences: bool) -> None:
    """The bad-input rules: a decoupled correction needs proximal log-probs, bypass refuses them, and a
    sequence-level correction needs sequence boundaries. Raises ValueError naming the argument."""
    if correction is None:
        return
    if not correction.bypass and proximal_logprobs is None:
        raise ValueError(
            "rollout_correction is a decoupled form: pass proximal_logprobs (the training model's log-probs "
            "before this update), or choose a bypass form (bypass=True, e.g. 'bypass_ppo_clip_geo_rs')"
        )
    if correction.bypass and proximal_logprobs is not None:
        raise ValueError(
            "rollout_correction is a bypass form, which anchors on behavior_logprobs: drop proximal_logprobs "
            "or choose a decoupled form"
        )
    if correction.needs_sequences and not has_sequences:
        raise ValueError(
            "rollout_correction has a sequence-level weight or rejection "
            f"({correction.rollout_is}, {list(correction.rollout_rs)}): pass cu_seqlens (sequence boundaries)"
        )
