"""A method setting is declared once, in `rwcore.method.MethodSettings` (`rwcore.method.setting`): `rw train`'s
config sections, `rw config --describe`, the YAML files and `method_settings(cfg)` follow from it."""

import dataclasses
import subprocess
import sys
import textwrap

from rwcore.method import MethodSettings
from rwcore.trainer.config import Config, config_to_dict, describe_config, load_config, method_keys
from rwcore.trainer.method_setup import method_settings


def test_a_setting_added_to_method_settings_reaches_describe_yaml_overrides_and_the_method(tmp_path):
    # A new field on MethodSettings -- nothing else is edited -- then the trainer's config is imported afresh.
    script = textwrap.dedent(f"""
        import dataclasses, sys
        import rwcore.method, rwcore.method.settings as m

        extra = ("novelty_bonus", float, m.setting(0.25, "A new knob, only declared on MethodSettings.",
                                                   "pool.novelty_bonus", ge=0, le=1))
        New = dataclasses.make_dataclass("MethodSettings", [extra], bases=(m.MethodSettings,), frozen=True)
        New.__module__ = m.__name__
        m.MethodSettings = rwcore.method.MethodSettings = New

        from rwcore.trainer.config import describe_config, dump_config, load_config
        from rwcore.trainer.method_setup import method_settings

        text = describe_config()
        assert "pool.novelty_bonus = 0.25  (float)  A new knob, only declared on MethodSettings." in text, text
        path = {str(tmp_path / "run.yaml")!r}
        open(path, "w").write("pool:\\n  novelty_bonus: 0.5\\n")
        cfg = load_config(path)
        assert cfg.pool.novelty_bonus == 0.5
        assert "novelty_bonus: 0.5" in dump_config(cfg)
        assert method_settings(load_config(path, ["pool.novelty_bonus=0.75"])).novelty_bonus == 0.75
        try:
            load_config(None, ["pool.novelty_bonus=2"])
        except ValueError as error:
            assert "pool.novelty_bonus" in str(error), error
        else:
            raise AssertionError("the declared range was not checked")
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_every_config_key_of_a_method_setting_round_trips_to_the_setting():
    keys = method_keys()
    # every MethodSettings field but the capability list (a method-only tuple) is a config key ...
    assert set(keys) == {f.name for f in dataclasses.fields(MethodSettings)} - {"capabilities"}
    # ... with its default, help and type, under the section it names
    sections = config_to_dict(Config())
    for name, key in keys.items():
        section, _, field = key.partition(".")
        assert sections[section][field] == getattr(MethodSettings(), name), key
    text = describe_config()
    for f in dataclasses.fields(MethodSettings):
        if f.name in keys:
            assert f"{keys[f.name]} = " in text and f.metadata["help"] in text
    # a non-default value of every setting reaches the method
    changed = {
        "batch_size": 5,
        "group_size": 3,
        "seed": 9,
        "rho_min": 0.2,
        "quota_fraction": 0.5,
        "gamma_obs": 0.3,
        "gamma_unobs": 0.99,
        "lam": 0.4,
        "eps": 1e-6,
        "ddof": 0,
        "length_alpha": 0.7,
        "length_threshold": 100,
        "scale_rewards": "batch",
        "aggregation": "normalize_then_sum",
        "process_gate": "success_groups",
        "delta_pool": 4,
        "retire_while_shown": not MethodSettings().retire_while_shown,
        "eta_high": 0.8,
        "eta_low": 0.2,
        "max_pool": 9,
        "max_new": 2,
        "max_records": 11,
        "adaptation_interval": 7,
        "budget": 3,
        "low_outcome": 0.4,
        "min_confidence": 0.6,
        "min_support": 2,
        "release_uninformative": not MethodSettings().release_uninformative,
        "rank_by": "support",
        "max_candidates": 4,
        "diagnosis_tasks": 5,
        "diagnostic_tasks": 3,
        "success_sample": 6,
        "expansion": False,
        "max_new_capabilities": 1,
        "max_revisions": 0,
        "process_normalization": "applicable",
    }
    assert set(changed) == set(keys)
    settings = method_settings(load_config(None, [f"{keys[name]}={value}" for name, value in changed.items()]))
    assert {name: getattr(settings, name) for name in changed} == changed


def test_a_method_setting_out_of_range_is_refused_by_both():
    import pytest

    with pytest.raises(ValueError, match="'pool.eta_high'"):
        load_config(None, ["pool.eta_high=1.5"])
    with pytest.raises(ValueError, match="eta_high"):
        MethodSettings(eta_high=1.5)
    with pytest.raises(ValueError, match="rank_by must be one of"):
        MethodSettings(rank_by="votes")


def _outside(metadata: dict):
    """A number just outside each declared bound."""
    for bound, step in (("ge", -1), ("gt", 0), ("le", 1), ("lt", 0)):
        if bound in metadata:
            yield metadata[bound] + step


def test_every_declared_bound_is_checked_by_the_settings_and_by_the_config():
    # The bounds live only in the declarations: each one is refused by MethodSettings (naming the field) and by
    # the config (naming the key), with no list of bounds anywhere else.
    import pytest

    checked = 0
    for f in dataclasses.fields(MethodSettings):
        for value in _outside(f.metadata):
            with pytest.raises(ValueError, match=rf"^{f.name} must be"):
                MethodSettings(**{f.name: value})
            if f.metadata.get("config"):
                with pytest.raises(ValueError, match=rf"'{f.metadata['config']}'"):
                    load_config(None, [f"{f.metadata['config']}={value}"])
            checked += 1
    assert checked >= 30
