"""Config input a careless user (or a pasted file) can give: duplicate keys, alias bombs, numbers that are
not finite or out of range, environment options that do not exist, and a malformed sampler snapshot.
Every refusal is one line naming the key, before a run folder is written."""

from __future__ import annotations

import copy
import math
import sys
import time

import pytest
from _util import TESTS, populated_sampler
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rwcore.trainer.cli import main
from rwcore.trainer.config import MAX_YAML_VALUES, load_config

sys.path.insert(0, str(TESTS))


# ---- duplicate keys --------------------------------------------------------------------------------

DUPLICATES = [
    "train:\n  steps: 5\ntrain:\n  seed: 3\n",  # a section twice
    "optim:\n  lr: 0.1\n  lr: 0.2\n",  # a key twice in a section
    "env:\n  options:\n    num_train: 8\n    num_train: 9\n",  # nested inside a dict field
    "train: {steps: 1, steps: 2}\n",  # flow style
    "judge:\n  kind: rule\nrollout: {}\njudge: {model: x}\n",  # apart, with other sections between
]


@pytest.mark.parametrize("text", DUPLICATES)
def test_a_key_given_twice_is_refused_naming_it_and_its_lines(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="given twice") as caught:
        load_config(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_duplicate_inside_an_override_value_is_refused():
    with pytest.raises(ValueError, match="env.options.*given twice"):
        load_config(None, ["env.options={num_train: 8, num_train: 9}"])


# ---- aliases ---------------------------------------------------------------------------------------


def _alias_bomb(levels: int, width: int) -> str:
    lines = ["a0: &a0 [x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + f"\ntrain: {{steps: 1}}\nenv:\n  options: {{bomb: *a{levels - 1}}}\n"


@pytest.mark.parametrize("levels,width", [(9, 10), (20, 3), (40, 2)])
def test_an_alias_bomb_is_refused_at_once(tmp_path, levels, width, no_trainer, capsys):
    assert width ** (levels - 1) > MAX_YAML_VALUES
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb(levels, width))
    assert len(path.read_bytes()) < 2000
    started = time.monotonic()
    with pytest.raises(ValueError, match="aliases expand to more than"):
        load_config(path)
    assert main(["config", "--config", str(path)]) == 2
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
    assert time.monotonic() - started < 5
    err = capsys.readouterr()
    assert len(err.out) < 10_000 and not (tmp_path / "run").exists()


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("env:\n  options: &o {inner: *o}\n")
    with pytest.raises(ValueError, match="recursive alias|not valid YAML"):
        load_config(path)


def test_a_few_aliases_still_work(tmp_path):
    path = tmp_path / "dry.yaml"
    path.write_text(
        "env:\n  options: {kind_weights: {standard: &w 1, bundle: *w, quote: *w}}\n"
        "train: {steps: &n 3, eval_every: *n}\n"
    )
    config = load_config(path)
    assert config.train.steps == 3 and config.train.eval_every == 3
    assert config.env.options["kind_weights"] == {"standard": 1, "bundle": 1, "quote": 1}


# ---- numbers ---------------------------------------------------------------------------------------

NON_FINITE = [".inf", "-.inf", ".nan", "1e400", "-1e999"]
FLOAT_KEYS = [
    "optim.lr",
    "rollout.temperature",
    "loss.entropy_coef",
    "loss.clip_c",
    "advantage.eps",
    "judge.timeout",
    "prior.lr",
    "rewardweaver.low_outcome",
    "optim.grad_clip",
]


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", NON_FINITE)
def test_a_non_finite_number_is_refused_naming_the_key(key, value):
    with pytest.raises(ValueError, match=rf"config key '{key}'"):
        load_config(None, [f"{key}={value}"])


@pytest.mark.parametrize(
    "override,key",
    [
        ("rollout.temperature=1e-300", "rollout.temperature"),
        ("rollout.temperature=0.001", "rollout.temperature"),
        ("rollout.temperature=1000", "rollout.temperature"),
        ("train.seed=-3", "train.seed"),
        ("train.seed=4294967296", "train.seed"),
        ("prior.seed=18446744073709551616", "prior.seed"),
        ("train.steps=1e30", "train.steps"),
        ("rollout.tasks_per_step=99999999999999999999", "rollout.tasks_per_step"),
        ("env.options.wall_seconds=.inf", "env.options.wall_seconds"),
        ("env.options={kind_weights: [1, .nan, 1]}", "env.options.kind_weights[1]"),
    ],
)
def test_an_out_of_range_number_is_refused_naming_the_key(override, key):
    with pytest.raises(ValueError) as caught:
        load_config(None, [override])
    assert f"'{key}'" in str(caught.value), caught.value


def test_the_ranges_keep_the_values_a_user_needs():
    config = load_config(None, ["rollout.temperature=0.05", "rollout.temperature=70", "train.seed=4294967295"])
    assert config.rollout.temperature == 70 and config.train.seed == 2**32 - 1


@settings(max_examples=60, deadline=None, derandomize=True)
@example("optim.lr", math.inf)  # cases the generator may not draw: finite checks that ranges alone missed
@example("loss.entropy_coef", -math.inf)
@example("train.steps", 2**70)
@given(
    st.sampled_from(FLOAT_KEYS + ["train.steps", "train.seed", "rollout.group_size"]),
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2**80), max_value=2**80)),
)
def test_any_number_either_loads_finite_and_in_range_or_is_refused_naming_the_key(key, value):
    text = repr(value) if isinstance(value, int) else {math.inf: ".inf", -math.inf: "-.inf"}.get(value, repr(value))
    if isinstance(value, float) and math.isnan(value):
        text = ".nan"
    try:
        config = load_config(None, [f"{key}={text}"])
    except ValueError as error:
        assert f"'{key}'" in str(error) and "\n" not in str(error)
        return
    section, name = key.split(".")
    got = getattr(getattr(config, section), name)
    assert math.isfinite(got) and (isinstance(got, float) or abs(got) <= 2**63 - 1)


# ---- environment options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env,option",
    [("negotiation", "num_tasks"), ("negotiation", "wall_seconds"), ("tools", "timeout"), ("tools", "Wall_seconds")],
)
def test_an_unknown_environment_option_is_refused_naming_it_and_the_choices(tmp_path, capsys, env, option):
    out = tmp_path / "run"
    assert (
        main(["train", "--out", str(out), "--quiet", "model.init=random", f"env.name={env}", f"env.options.{option}=3"])
        == 2
    )
    err = capsys.readouterr().err
    assert f"'env.options.{option}'" in err and "its options:" in err and err.count("\n") == 1
    assert not (out / "config.yaml").exists()


# ---- the sampler's snapshot -------------------------------------------------------------------------


def _sampler_state():
    _, sampler = populated_sampler()
    return sampler.state_dict()


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(obj, list):
        for index, value in enumerate(obj[:2]):
            yield from _paths(value, prefix + (index,))


BAD = [None, "x", -1, 2**70, float("nan"), float("inf"), [], {}, [[1]], 1.5, True, b"\x00garbage", "DELETE"]


def test_a_malformed_sampler_snapshot_is_always_a_value_error_and_changes_nothing():
    """Every field of a real snapshot (two levels into lists), replaced by each bad value or deleted:
    load_state_dict raises ValueError (KeyError, TypeError and OverflowError escaped before) and the
    sampler's own state is what it was."""
    state = _sampler_state()
    _, intact = populated_sampler(seed=0)
    intact.load_state_dict(copy.deepcopy(state))  # the unbroken snapshot still loads, exactly
    assert intact.state_dict() == state
    tried = 0
    for path in list(_paths(state))[1:]:
        for bad in BAD:
            broken = copy.deepcopy(state)
            parent = broken
            for key in path[:-1]:
                parent = parent[key]
            if not isinstance(parent, (dict, list)):
                continue
            if bad == "DELETE":
                del parent[path[-1]]
            else:
                parent[path[-1]] = bad
            _, sampler = populated_sampler(seed=1)
            before = sampler.state_dict()
            try:
                sampler.load_state_dict(broken)
            except ValueError:
                assert sampler.state_dict() == before, path  # all or nothing
            tried += 1
    assert tried > 200
