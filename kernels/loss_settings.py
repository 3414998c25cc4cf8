"""The filtered dual-clip loss's settings (Arise eq. 18-19, appendix B.4), each declared once with its default,
help, `rw train` config key and range (`rwcore.settings.setting`).

Everything that takes a loss setting takes its default and range from `LossSettings`: the functional forms
(`filtered_dual_clip_loss`, `fused_linear_policy_loss`), the nn.Module wrappers, `rw train`'s `loss` section
(`rw config --describe`, YAML, overrides), and the TRL, OpenRLHF and verl drop-ins (OpenRLHF and verl map their
own keys onto these: clip_eps_low / clip_ratio_low -> ratio_low, ...). A setting added here reaches all of them;
the kernel's arithmetic reads it from the `LossSettings` each call resolves (`resolve_loss_settings`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rwcore.settings import (
    SettingError,
    check_settings,
    describe_settings,
    setting,
    setting_types,
    settings_dict,
)

__all__ = ["LOSS_DEFAULTS", "LossSettings", "loss_setting_names", "pop_loss_settings", "resolve_loss_settings"]


@dataclass(frozen=True)
class LossSettings:
    """The loss's settings: tokens whose importance ratio w leaves (ratio_low, ratio_high) are dropped, and a
    negative-advantage token's term is capped at clip_c |A| (dual clip). The defaults are Arise's."""

    ratio_low: float = setting(0.5, "Importance ratios at or below this are filtered out.", "loss.ratio_low", ge=0)
    ratio_high: float = setting(
        5.0, "Importance ratios at or above this are filtered out.", "loss.ratio_high", gt=0, above="ratio_low"
    )
    clip_c: float = setting(3.0, "Dual-clip constant c.", "loss.clip_c", gt=1)

    def __post_init__(self) -> None:
        check_settings(self)

    def to_dict(self) -> dict:
        return settings_dict(self)

    @classmethod
    def describe(cls) -> str:
        """One line per setting: name, config key, default and help."""
        return describe_settings(cls)


LOSS_DEFAULTS = LossSettings()
"""The declared defaults, for the signatures of the loss's entry points."""


def loss_setting_names() -> tuple[str, ...]:
    """The declared settings' names, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(LossSettings))


def resolve_loss_settings(**values) -> LossSettings:
    """`LossSettings` from keyword values as the kernels take them: a float setting takes anything `float()` reads
    (a Python or NumPy number, a 0-dim tensor); an unset one keeps its declared default. TypeError naming an
    undeclared setting; ValueError (`rwcore.settings.SettingError`) naming one outside its declared range."""
    names = loss_setting_names()
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise TypeError(f"unknown loss setting(s) {unknown}; the declared ones (LossSettings) are {list(names)}")
    kinds = setting_types(LossSettings)
    converted = {}
    for name, value in values.items():
        if kinds[name] is float:
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise SettingError(f"{name} must be a number, got {value!r}", [name]) from None
        converted[name] = value
    return LossSettings(**converted)


def pop_loss_settings(kwargs: dict) -> LossSettings:
    """The declared loss settings among `kwargs`, removed from it, resolved (`resolve_loss_settings`): for a
    drop-in that passes its other keyword arguments on (TRL's trainer)."""
    return resolve_loss_settings(**{name: kwargs.pop(name) for name in loss_setting_names() if name in kwargs})
