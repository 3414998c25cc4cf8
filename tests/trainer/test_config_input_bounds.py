"""Config input at its limits: a `--config` that is not a regular file or is too large, nesting and dotted keys
too deep, integers of thousands of digits, documents of too many values, YAML tags that are not plain data,
numbers in verl's threshold syntax, the negotiation environment's kind_weights, and `rw compare --out` into a
folder that does not exist. Every refusal is one line naming the key or the path (exit 2 from `rw`, a ValueError
from `load_config`), before a run folder is written; the values a user needs still load."""

from __future__ import annotations

import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rwcore.trainer.cli import main
from rwcore.trainer.config import config_from_dict, load_config, rollout_correction

MIB = 1024 * 1024
SIZE_BOUND = 4 * MIB  # docs/configs.md: a config file holds at most 4 MiB
DEPTH_BOUND = 64  # docs/configs.md: lists and mappings nest at most 64 levels
KEY_BOUND = 32  # docs/configs.md: a dotted key has at most 32 parts
KINDS = ("standard", "bundle", "haggler", "quote", "no_deal", "hostile", "sold_out")  # the negotiation task kinds


def _one_line(capsys) -> str:
    """The error `rw` printed: exactly one line, `rw: error: ...`, no traceback, nothing on stdout."""
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("rw: error: ") and err.count("\n") == 1 and "Traceback" not in err, err[:2000]
    assert len(err) < 1000, err[:2000]
    return err


def _refusal(call) -> str:
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and len(message) < 1000, message[:2000]
    return message


def _rw_child(cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`rw ARGS` in a child process held to 2 GiB of address space (a read without a bound fails there within
    seconds instead of filling the machine), killed after `timeout` seconds."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, 2 * 1024**3))

    try:
        return subprocess.run(
            [sys.executable, "-m", "rwcore.trainer", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=limit,
            cwd=cwd,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"rw {' '.join(args)} still ran after {timeout} s")


# ---- what a --config is --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["device", "fifo", "symlink to a device"])
def test_a_config_that_is_not_a_regular_file_is_refused_at_once_naming_it(tmp_path, kind):
    if kind == "device":
        path = Path("/dev/zero")
    elif kind == "fifo":
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)
    else:
        path = tmp_path / "zeros.yaml"
        path.symlink_to("/dev/zero")
    out = tmp_path / "run"
    started = time.monotonic()
    done = _rw_child(tmp_path, "train", "--config", str(path), "--out", str(out), "--quiet")
    assert time.monotonic() - started < 60
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("rw: error: ") and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert repr(str(path)) in done.stderr and "not a regular file" in done.stderr
    assert not out.exists()


def test_rw_config_on_a_fifo_does_not_wait_for_a_writer(tmp_path):
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    done = _rw_child(tmp_path, "config", "--config", str(path), timeout=30)
    assert done.returncode == 2 and repr(str(path)) in done.stderr and done.stderr.count("\n") == 1


def test_a_folder_or_an_impossible_path_is_refused_naming_it(tmp_path, capsys):
    folder = tmp_path / "configs.yaml"
    folder.mkdir()
    message = _refusal(lambda: load_config(folder))
    assert repr(str(folder)) in message
    assert main(["config", "--config", str(folder)]) == 2
    assert repr(str(folder)) in _one_line(capsys)
    message = _refusal(lambda: load_config("my\0config.yaml"))
    assert "config file" in message and "my\\x00config.yaml" in message


@pytest.mark.parametrize("command", ["config", "train", "ablate", "pretrain"])
def test_a_config_file_over_the_size_bound_is_refused_before_it_is_parsed(tmp_path, capsys, no_trainer, command):
    path = tmp_path / "huge.yaml"
    # the unknown section at the end makes a loader without the bound stop there too, before any run starts
    path.write_text("train:\n  steps: 3\n# " + "x" * SIZE_BOUND + "\nnot_a_section: 1\n")
    out = tmp_path / "out"
    argv = {
        "config": ["config", "--config", str(path)],
        "train": ["train", "--config", str(path), "--out", str(out), "--quiet"],
        "ablate": ["ablate", "--paper", "arise", "--config", str(path), "--out", str(out), "--quiet"],
        "pretrain": ["pretrain", "--config", str(path), "--quiet"],
    }[command]
    started = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - started < 1.0  # refused from its size, not after parsing 4 MiB
    err = _one_line(capsys)
    assert repr(str(path)) in err and "4 MiB" in err
    assert not out.exists()


def test_a_config_file_a_little_under_the_bound_and_a_symlinked_one_still_load(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text("train:\n  steps: 3\n# " + "x" * (MIB // 4) + "\n")
    assert load_config(path).train.steps == 3
    link = tmp_path / "link.yaml"
    link.symlink_to(path)
    assert load_config(link).train.steps == 3


@pytest.mark.parametrize("name", ["default", "arise-hard", "arise-qwen", "rewardweaver-qwen"])
def test_every_shipped_config_still_loads(capsys, name):
    assert main(["config", "--config", name]) == 0
    assert "train:" in capsys.readouterr().out


def test_the_readme_config_is_arise_on_the_hard_tier_with_the_hide_first_lifecycle(capsys):
    assert main(["config", "--config", "arise-hard"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["train"]["method"] == "arise"
    assert shown["env"] == {"name": "negotiation", "options": {"difficulty": "hard"}}
    assert shown["pool"]["retire_while_shown"] is False
    # everything else is the embedded default's
    assert main(["config"]) == 0
    default = yaml.safe_load(capsys.readouterr().out)
    differ = {
        (section, key)
        for section in default
        for key in default[section]
        if default[section][key] != shown[section][key]
    }
    assert differ == {("train", "method"), ("env", "options")}


def test_a_file_that_is_not_yaml_or_not_utf8_is_one_line_naming_it(tmp_path, capsys):
    broken = tmp_path / "broken.yaml"
    broken.write_text("train:\n  steps: [1, 2\n")
    assert main(["config", "--config", str(broken)]) == 2
    err = _one_line(capsys)
    assert repr(str(broken)) in err and "not valid YAML" in err and "line" in err
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"train:\n  steps: \xff\xfe\n")
    message = _refusal(lambda: load_config(binary))
    assert repr(str(binary)) in message and "UTF-8" in message


# ---- how many values -----------------------------------------------------------------------------------


def test_a_long_plain_list_is_refused_for_its_size_not_for_aliases(tmp_path, capsys, no_trainer):
    items = ", ".join(["0"] * 100_001)
    path = tmp_path / "list.yaml"
    path.write_text(f"env:\n  options:\n    xs: [{items}]\n")
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
    err = _one_line(capsys)
    assert repr(str(path)) in err and "more than 100000 values" in err and "alias" not in err, err
    assert not (tmp_path / "run").exists()
    message = _refusal(lambda: load_config(None, [f"env.options.xs=[{items}]"]))
    assert "'env.options.xs'" in message and "more than 100000 values" in message and "alias" not in message
    ten_thousand = ", ".join(["1"] * 10_000)
    assert load_config(None, [f"env.options.xs=[{ten_thousand}]"]).env.options["xs"] == [1] * 10_000


# ---- nesting and dotted keys ---------------------------------------------------------------------------


def _block_mappings(levels: int) -> str:
    lines = ["env:", "  options:"]
    lines += ["  " * (i + 2) + f"k{i}:" for i in range(levels)]
    return "\n".join(lines) + " 1\n"


@pytest.mark.parametrize(
    "source,prefix",
    [
        ("file-flow", "env.options.deep"),
        ("file-block", "env.options.k0.k1"),
        ("override-flow", "env.options.deep"),
        ("override-mapping", "env.options.a"),
        ("override-whole-field", "env.options.outer"),
        ("dict", "env.options.deep"),
    ],
)
def test_nesting_too_deep_is_refused_naming_the_key_path(tmp_path, source, prefix):
    deep = "[" * 20_000 + "]" * 20_000
    path = tmp_path / "deep.yaml"
    if source == "file-flow":
        path.write_text(f"env:\n  options:\n    deep: {deep}\n")
        call = lambda: load_config(path)  # noqa: E731
    elif source == "file-block":
        path.write_text(_block_mappings(100))
        call = lambda: load_config(path)  # noqa: E731
    elif source == "override-flow":
        call = lambda: load_config(None, [f"env.options.deep={deep}"])  # noqa: E731
    elif source == "override-mapping":
        call = lambda: load_config(None, ["env.options.a=" + "{a: " * 5_000 + "1" + "}" * 5_000])  # noqa: E731
    elif source == "override-whole-field":
        call = lambda: load_config(None, [f"env.options={{outer: {deep}}}"])  # noqa: E731
    else:
        nested: list = []
        for _ in range(20_000):
            nested = [nested]
        call = lambda: config_from_dict({"env": {"options": {"deep": nested}}})  # noqa: E731
    message = _refusal(call)
    assert f"'{prefix}" in message and f"deeper than {DEPTH_BOUND}" in message, message


def test_rw_train_refuses_a_deep_file_before_a_run_folder(tmp_path, capsys, no_trainer):
    path = tmp_path / "deep.yaml"
    path.write_text("env:\n  options:\n    deep: " + "[" * 20_000 + "]" * 20_000 + "\n")
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
    err = _one_line(capsys)
    assert "'env.options.deep" in err and repr(str(path)) in err
    assert not (tmp_path / "run").exists()


def test_ordinary_nesting_still_loads(tmp_path):
    value = "[" * 40 + "7" + "]" * 40
    config = load_config(None, [f"env.options.deep={value}"])
    inner = config.env.options["deep"]
    for _ in range(40):
        inner = inner[0]
    assert inner == 7
    path = tmp_path / "nested.yaml"
    path.write_text(_block_mappings(30))
    node = load_config(path).env.options
    for i in range(30):
        node = node[f"k{i}"]
    assert node == 1


@pytest.mark.parametrize("parts", [KEY_BOUND + 1, 3_000, 50_000])
def test_a_dotted_key_too_deep_is_refused_naming_its_prefix(capsys, parts):
    key = "env.options." + ".".join(["a"] * (parts - 2))
    message = _refusal(lambda: load_config(None, [f"{key}=1"]))
    assert "'env.options.a.a" in message and str(KEY_BOUND) in message, message
    assert main(["config", f"{key}=1"]) == 2
    assert "'env.options.a.a" in _one_line(capsys)


def test_a_dotted_key_within_the_bound_still_sets_the_nested_value():
    names = [f"n{i}" for i in range(KEY_BOUND - 2)]
    config = load_config(None, ["env.options." + ".".join(names) + "=5"])
    node = config.env.options
    for name in names:
        node = node[name]
    assert node == 5


# ---- integers ------------------------------------------------------------------------------------------

HUGE = [
    ("train.seed=" + "1" * 5_000, "train.seed"),
    ("train.steps=-" + "9" * 5_000, "train.steps"),
    ("train.seed=0x" + "f" * 5_000, "train.seed"),
    ("optim.lr=" + "1" * 5_000, "optim.lr"),
    ("optim.lr=1" + "0" * 400, "optim.lr"),
    ("rollout.temperature=" + "3" * 320, "rollout.temperature"),
    ("env.options.n=" + "1_" * 2_500 + "1", "env.options.n"),
    ("env.options={xs: [1, " + "7" * 5_000 + "]}", "env.options.xs[1]"),
    ("judge.max_tokens=" + "2" * 4_301, "judge.max_tokens"),
]


@pytest.mark.parametrize("override,key", HUGE)
def test_an_integer_of_thousands_of_digits_is_refused_naming_the_key(override, key):
    started = time.monotonic()
    message = _refusal(lambda: load_config(None, [override]))
    assert f"'{key}'" in message and "64-bit integer" in message, message
    assert time.monotonic() - started < 2


def test_a_huge_integer_in_a_file_or_a_dict_is_refused_naming_the_key(tmp_path, capsys, no_trainer):
    path = tmp_path / "seed.yaml"
    path.write_text("train:\n  seed: " + "1" * 5_000 + "\n")
    message = _refusal(lambda: load_config(path))
    assert "'train.seed'" in message and repr(str(path)) in message
    assert "'train.seed'" in _refusal(lambda: config_from_dict({"train": {"seed": 10**5000}}))
    assert "'optim.lr'" in _refusal(lambda: config_from_dict({"optim": {"lr": 10**400}}))
    assert "'env.options.n'" in _refusal(lambda: config_from_dict({"env": {"options": {"n": -(10**5000)}}}))
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "train.seed=" + "1" * 5_000]) == 2
    assert "'train.seed'" in _one_line(capsys) and not out.exists()


def test_the_integers_a_user_needs_still_load():
    config = load_config(None, ["train.seed=4294967295", "train.steps=1_000", "optim.lr=3", "env.options.n=12"])
    assert (config.train.seed, config.train.steps, config.optim.lr) == (4294967295, 1000, 3.0)
    assert config.env.options["n"] == 12


# ---- YAML tags -----------------------------------------------------------------------------------------

TAGGED = [
    "!!set {a, b}",
    "!!python/object/apply:os.system ['true']",
    "!!python/name:os.system",
    "!!binary aGVsbG8=",
    "!!timestamp 2024-01-01",
    "2024-01-01",
    "2001-12-14t21:59:43.10-05:00",
    "!!omap [{a: 1}]",
    "!!pairs [{a: 1}]",
    "!local x",
    "!!float abc",
    "!!int abc",
    "!!bool maybe",
]


@pytest.mark.parametrize("value", TAGGED)
def test_a_yaml_value_that_is_not_plain_data_is_refused_naming_the_key(tmp_path, value):
    for override, key in (
        (f"env.options.x={value}", "env.options.x"),
        (f"env.options={{outer: [1, {value} ]}}", "env.options.outer[1]"),
        (f"model.name={value}", "model.name"),
        (f"train.steps={value}", "train.steps"),
    ):
        message = _refusal(lambda: load_config(None, [override]))
        assert f"'{key}'" in message, (override, message)
    path = tmp_path / "tagged.yaml"
    path.write_text(f"env:\n  options:\n    x: {value}\n")
    message = _refusal(lambda: load_config(path))
    assert "'env.options.x'" in message and repr(str(path)) in message, message


def test_plain_yaml_values_still_load():
    config = load_config(
        None, ["env.options={a: 1, b: 2.5, c: text, d: true, e: null, f: [1, {g: h}], i: '2024-01-01'}"]
    )
    assert config.env.options == {
        "a": 1,
        "b": 2.5,
        "c": "text",
        "d": True,
        "e": None,
        "f": [1, {"g": "h"}],
        "i": "2024-01-01",
    }
    assert load_config(None, ["model.name='!local x'"]).model.name == "!local x"


# ---- verl's threshold syntax ---------------------------------------------------------------------------

BAD_THRESHOLDS = [
    ("decoupled_token_mis", "loss.rollout_is_threshold", "0.5_2_0"),
    ("decoupled_token_mis", "loss.rollout_is_threshold", "0.5_2_000"),
    ("decoupled_token_mis", "loss.rollout_is_threshold", "0.5_ 2.0"),
    ("decoupled_token_mis", "loss.rollout_is_threshold", "0.5_2.0_3.0"),
    ("decoupled_token_is", "loss.rollout_is_threshold", "\u0662.0"),  # an Arabic-Indic two, which float() reads
    ("decoupled_token_is", "loss.rollout_is_threshold", "1 0"),
    ("decoupled_seq_is_rs", "loss.rollout_rs_threshold", "0.5_2_0"),
    ("decoupled_seq_is_rs", "loss.rollout_rs_threshold", "0.5 _2.0"),
    ("decoupled_k3_rs", "loss.rollout_rs_threshold", "0.0\u0661"),
]


@pytest.mark.parametrize("preset,key,value", BAD_THRESHOLDS)
def test_a_threshold_outside_verls_number_syntax_is_refused_naming_the_key(capsys, preset, key, value):
    overrides = [f"loss.rollout_correction={preset}", f"{key}={value}"]
    message = _refusal(lambda: load_config(None, overrides))
    assert f"'{key}'" in message and "lower_upper" in message, message
    assert main(["config", *overrides]) == 2
    assert f"'{key}'" in _one_line(capsys)


def test_a_threshold_in_a_file_keeps_the_text_as_typed(tmp_path):
    """YAML 1.1 reads 0.5_20 as the number 0.52: the string key must see what the user typed."""
    path = tmp_path / "mis.yaml"
    path.write_text("loss:\n  rollout_correction: decoupled_token_mis\n  rollout_is_threshold: 0.5_20\n")
    correction = rollout_correction(load_config(path))
    assert (correction.is_threshold_lower, correction.is_threshold, correction.is_mode) == (0.5, 20.0, "mask")
    path.write_text("loss:\n  rollout_correction: decoupled_token_mis\n  rollout_is_threshold: 0.5_2_0\n")
    message = _refusal(lambda: load_config(path))
    assert "'loss.rollout_is_threshold'" in message and "'0.5_2_0'" in message, message


@pytest.mark.parametrize(
    "preset,key,value,expected",
    [
        ("decoupled_token_is", "loss.rollout_is_threshold", "2.0", (None, 2.0, "truncate")),
        ("decoupled_token_is", "loss.rollout_is_threshold", "3", (None, 3.0, "truncate")),
        ("decoupled_token_mis", "loss.rollout_is_threshold", "0.5_2.0", (0.5, 2.0, "mask")),
        ("decoupled_token_mis", "loss.rollout_is_threshold", "5e-1_2E0", (0.5, 2.0, "mask")),
        ("decoupled_token_mis", "loss.rollout_is_threshold", ".25_4.", (0.25, 4.0, "mask")),
        ("decoupled_seq_is_rs", "loss.rollout_rs_threshold", "0.999_1.001", ((0.999, 1.001),)),
        ("decoupled_k3_rs", "loss.rollout_rs_threshold", "0.02", ((None, 0.02),)),
    ],
)
def test_verls_threshold_syntax_still_loads(preset, key, value, expected):
    correction = rollout_correction(load_config(None, [f"loss.rollout_correction={preset}", f"{key}={value}"]))
    if key.endswith("is_threshold"):
        assert (correction.is_threshold_lower, correction.is_threshold, correction.is_mode) == expected
    else:
        assert correction.rs_bounds == expected


# ---- env.options.kind_weights --------------------------------------------------------------------------

BAD_WEIGHTS = [
    "5",
    "[1, 2]",
    "standard",
    "{standard: -1}",
    "{standard: .nan}",
    "{standard: .inf}",
    "{standard: '1'}",
    "{standard: true}",
    "{standard: [1]}",
    "{fancy: 1}",
    "{standard: 0, bundle: 0}",
    "{}",
    "!!set {standard, bundle}",
]


@pytest.mark.parametrize("value", BAD_WEIGHTS)
def test_bad_kind_weights_are_refused_naming_the_key(tmp_path, capsys, no_trainer, value):
    message = _refusal(lambda: load_config(None, [f"env.options.kind_weights={value}"]))
    assert "'env.options.kind_weights" in message, message
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--quiet", f"env.options.kind_weights={value}"]) == 2
    err = _one_line(capsys)
    assert "'env.options.kind_weights" in err and not out.exists()


def test_kind_weights_messages_say_what_they_must_be():
    message = _refusal(lambda: load_config(None, ["env.options.kind_weights=5"]))
    assert "mapping" in message and "non-negative" in message and all(kind in message for kind in KINDS)
    message = _refusal(lambda: load_config(None, ["env.options.kind_weights={fancy: 1}"]))
    assert "'env.options.kind_weights.fancy'" in message and "standard" in message
    message = _refusal(lambda: load_config(None, ["env.options.kind_weights={standard: -1}"]))
    assert "'env.options.kind_weights.standard'" in message and "-1" in message


def test_good_kind_weights_still_load_and_build_the_environment():
    from rwcore.trainer import envs

    weights = "env.options.kind_weights={standard: 2, hostile: 0.5, quote: 0}"
    config = load_config(None, [weights, "env.options.num_train=40", "env.options.num_eval=20"])
    env = envs.make(config.env.name, **dict(config.env.options))
    assert env.kind_weights == {"standard": 2.0, "hostile": 0.5}
    config = load_config(None, ["env.options.kind_weights.bundle=1", "env.options.kind_weights=null"])
    assert config.env.options["kind_weights"] is None
    other = load_config(None, ["env.name=tools", "env.options.kind_weights=5"])  # another environment's options
    assert other.env.options["kind_weights"] == 5  # are that environment's to check


# ---- rw compare ----------------------------------------------------------------------------------------


def _run_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    rows = [
        '{"step": 0, "kind": "eval", "eval/success_rate": 0.1}',
        '{"step": 10, "kind": "eval", "eval/success_rate": 0.4}',
    ]
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def test_compare_out_into_a_missing_folder_creates_it(tmp_path, capsys):
    run = _run_folder(tmp_path / "a")
    out = tmp_path / "figures" / "new" / "compare.png"
    assert main(["compare", str(run), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["compare.png"]  # no temporary file left
    assert str(out) in capsys.readouterr().out


@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_compare_out_that_cannot_be_a_file_is_one_line_naming_it(tmp_path, capsys, where):
    run = _run_folder(tmp_path / "a")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    if where == "a folder":
        out = tmp_path / "plots.png"
        out.mkdir()
        named = out
    else:
        out = notes / "compare.png"
        named = notes
    assert main(["compare", str(run), "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert "--out" in err and repr(str(named)) in err
    assert notes.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["a", "notes.txt"] + (["plots.png"] if where == "a folder" else [])
    )


@pytest.mark.parametrize("content", ["deep", "huge", "tagged"])
def test_compare_refuses_a_run_whose_config_cannot_be_read_naming_it(tmp_path, capsys, content):
    run = _run_folder(tmp_path / "a")
    text = {
        "deep": "env:\n  options:\n    deep: " + "[" * 20_000 + "]" * 20_000 + "\n",
        "huge": "train:\n  seed: 0\n# " + "x" * SIZE_BOUND + "\n",
        "tagged": "train:\n  seed: !!python/object/apply:os.system ['true']\n",
    }[content]
    (run / "config.yaml").write_text(text)
    out = tmp_path / "c.png"
    assert main(["compare", str(run), "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert repr(str(run)) in err and "config.yaml" in err
    assert not out.exists()


def test_compare_still_groups_ordinary_run_configs(tmp_path, capsys):
    runs = []
    for seed in (0, 1):
        run = _run_folder(tmp_path / f"arise-s{seed}")
        (run / "config.yaml").write_text(f"train:\n  method: arise\n  seed: {seed}\noptim:\n  lr: 0.001\n")
        runs.append(run)
    assert main(["compare", *map(str, runs), "--out", str(tmp_path / "c.png")]) == 0
    assert "2 run(s), seeds 0,1" in capsys.readouterr().out
    from rwcore.trainer.compare import group_runs

    groups = group_runs(runs)
    assert len(groups) == 1 and groups[0]["seeds"] == [0, 1]
    assert math.isclose(groups[0]["config"]["optim.lr"], 0.001)
