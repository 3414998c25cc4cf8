"""rwcore.settings: a setting's declaration (default, help, config key, range, order) and the checks
derived from it, by declared type."""

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pytest

from rwcore.settings import SettingError, check_settings, config_keys, describe_settings, setting, settings_dict


@dataclass(frozen=True)
class Knobs:
    count: int = setting(2, "A count.", "demo.count", gt=0, le=10)
    share: float = setting(0.5, "A share.", "demo.share", ge=0, lt=1)
    low: float = setting(0.25, "A lower bound.", "demo.low", ge=0)
    high: float = setting(0.75, "An upper bound.", "demo.high", above="low")
    free: float = setting(1.0, "Any finite number.")
    mode: Literal["a", "b"] = setting("a", "A choice.", "demo.mode")
    flag: bool = setting(True, "A switch.", "demo.flag")
    names: tuple[str, ...] = setting(("x", "y"), "Not checked.")

    def __post_init__(self) -> None:
        check_settings(self)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"count": 0}, "count must be in [1, 10], got 0"),
        ({"count": 11}, "count must be in [1, 10], got 11"),
        ({"count": 2.0}, "count must be an integer, got 2.0"),
        ({"count": True}, "count must be an integer, got True"),
        ({"share": 1.0}, "share must be a finite number in [0, 1), got 1.0"),
        ({"share": -0.1}, "share must be a finite number in [0, 1), got -0.1"),
        ({"share": "0.5"}, "share must be a finite number in [0, 1), got '0.5'"),
        ({"free": float("nan")}, "free must be a finite number, got nan"),
        ({"free": float("inf")}, "free must be a finite number, got inf"),
        ({"mode": "c"}, "mode must be one of ('a', 'b'), got 'c'"),
        ({"flag": 1}, "flag must be True or False, got 1"),
        ({"low": 0.8}, "low must be below high, got 0.8 and 0.75"),
    ],
)
def test_a_value_outside_its_declaration_is_refused_naming_the_setting(values, message):
    with pytest.raises(SettingError) as info:
        Knobs(**values)
    assert str(info.value) == message
    assert info.value.names == (("low", "high") if "below" in message else tuple(values))
    assert isinstance(info.value, ValueError)


def test_values_inside_their_declaration_pass_as_they_are():
    knobs = Knobs(count=np.int64(10), share=0, low=0.0, high=0.1, free=-3, mode="b", flag=np.bool_(False))
    assert knobs.count == 10 and knobs.share == 0 and type(knobs.share) is int  # checked, not converted
    assert settings_dict(Knobs()) == {
        "count": 2,
        "share": 0.5,
        "low": 0.25,
        "high": 0.75,
        "free": 1.0,
        "mode": "a",
        "flag": True,
        "names": ["x", "y"],
    }


def test_the_declaration_carries_help_config_key_and_range():
    assert config_keys(Knobs) == {
        "count": "demo.count",
        "share": "demo.share",
        "low": "demo.low",
        "high": "demo.high",
        "mode": "demo.mode",
        "flag": "demo.flag",
    }
    lines = describe_settings(Knobs).splitlines()
    assert lines[0] == "count [demo.count] = 2: A count."
    assert lines[4] == "free [(not a config key)] = 1.0: Any finite number."
    with pytest.raises(TypeError, match="unknown bounds"):
        setting(1, "A typo in a bound.", "demo.x", gte=0)
