"""Typed config: defaults, YAML + dotted overrides, coercion, clear errors, round trip."""

import dataclasses

import pytest
import yaml

from rwcore.trainer.config import (
    Config,
    config_from_dict,
    config_to_dict,
    describe_config,
    load_config,
    resolve_variant,
    save_config,
)


def write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults():
    cfg = load_config()
    assert cfg == resolve_variant(Config())
    # the keys that only repeated train.method are gone (the variant alone says which sampler, skills, strategy)
    assert not hasattr(cfg.sampler, "kind") and not hasattr(cfg.pool, "skills")
    assert not hasattr(cfg.rewardweaver, "selection")
    assert cfg.env.name == "negotiation" and cfg.env.options == {}
    assert cfg.model.name is None and cfg.model.hidden_size == 64 and cfg.model.device == "auto"
    assert cfg.rollout.engine == "hf" and cfg.rollout.group_size == 8
    assert cfg.optim.lr == 3e-4 and cfg.loss.clip_c == 3.0 and cfg.advantage.ddof == 1
    # the embedded default's exploration and action settings, shared by every variant
    assert cfg.loss.entropy_coef == 0.01 and cfg.rollout.action_words == "auto" and cfg.rollout.max_new_tokens == 1
    assert cfg.model.tie_embeddings is True
    assert cfg.sampler.gamma_unobs == 0.999 and cfg.pool.max_pool == 64 and cfg.rewardweaver.expansion is True
    assert cfg.rewardweaver.adaptation_interval == 30 and cfg.rewardweaver.budget == 6
    assert cfg.rewardweaver.process_normalization == "active_set" and cfg.rewardweaver.rank_by == "rate"
    assert cfg.judge.kind == "rule" and cfg.judge.api_key_env == "OPENAI_API_KEY"
    assert (
        cfg.train.method == "rewardweaver"
        and cfg.train.steps == 500
        and cfg.train.eval_every == 50
        and cfg.train.engine == "torch"
    )


def test_defaults_are_not_shared():
    a, b = Config(), Config()
    a.env.options["x"] = 1
    assert b.env.options == {}


def test_every_field_is_documented():
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(
            section.type if isinstance(section.type, type) else type(getattr(Config(), section.name))
        ):
            assert f.metadata.get("help"), f"{section.name}.{f.name}"
    text = describe_config()
    assert "train.steps = 500" in text and "sampler.gamma_unobs = 0.999" in text and "sampler.kind" not in text


def test_yaml_then_overrides(tmp_path):
    path = write(
        tmp_path,
        """
train:
  steps: 50
  method: arise
optim:
  lr: 1.0e-4
pool:
  skills: off
env:
  options: {difficulty: 2}
""",
    )
    with pytest.warns(DeprecationWarning, match=r"'pool.skills' is set by train.method.*rwcore 0\.2\.0 refuses it"):
        cfg = load_config(path, ["train.method=arise_no_skills"])  # what the variant says: accepted, not stored
    assert cfg.train.steps == 50 and cfg.train.method == "arise_no_skills"
    assert cfg.optim.lr == 1e-4 and not hasattr(cfg.pool, "skills")
    assert cfg.env.options == {"difficulty": 2}
    with pytest.raises(ValueError, match="'pool.skills': train.method=arise sets it to 'on', got 'off'"):
        load_config(path)  # arise injects skills: the ablation is a variant of its own
    cfg = load_config(path, ["train.steps=20", "optim.lr=1e-3", "pool.skills=on"])
    assert cfg.train.steps == 20 and cfg.optim.lr == 1e-3
    assert cfg.train.method == "arise"  # untouched by overrides
    with pytest.raises(ValueError, match="'rewardweaver.selection': train.method=arise_no_skills does not use it"):
        load_config(path, ["train.method=arise_no_skills", "rewardweaver.selection=attribution"])
    last = load_config(path, ["train.steps=1", "train.steps=2", "pool.skills=null"])
    assert last.train.steps == 2


def test_empty_yaml_and_empty_sections(tmp_path):
    assert load_config(write(tmp_path, "")) == load_config()
    assert load_config(write(tmp_path, "train:\n", "b.yaml")) == load_config()


@pytest.mark.parametrize(
    "override, section, key, expected",
    [
        ("train.steps=20", "train", "steps", 20),
        ("train.steps=1_000", "train", "steps", 1000),
        ("train.steps=2.0", "train", "steps", 2),
        ("optim.lr=1e-3", "optim", "lr", 1e-3),  # YAML 1.1 reads 1e-3 as a string
        ("optim.lr=1", "optim", "lr", 1.0),
        ("rollout.action_words=on", "rollout", "action_words", "on"),
        ("judge.base_url=http://localhost:8000/v1", "judge", "base_url", "http://localhost:8000/v1"),
        ("judge.model=1.10", "judge", "model", "1.10"),  # a str field keeps the text as typed
        ("judge.model=", "judge", "model", ""),
        ("model.name=null", "model", "name", None),
        ("model.name=Qwen/Qwen2.5-0.5B", "model", "name", "Qwen/Qwen2.5-0.5B"),
        ("model.name='null'", "model", "name", "null"),
        ("env.options={a: 1, b: [1, 2]}", "env", "options", {"a": 1, "b": [1, 2]}),
        ("rewardweaver.expansion=off", "rewardweaver", "expansion", False),  # what earlier configs wrote
        ("rewardweaver.expansion=false", "rewardweaver", "expansion", False),
        ("judge.timeout=5", "judge", "timeout", 5.0),
    ],
)
def test_override_coercion(override, section, key, expected):
    value = getattr(getattr(load_config(None, [override]), section), key)
    assert value == expected and type(value) is type(expected)


def test_nested_dict_override():
    cfg = load_config(None, ["env.options={a: 1}", "env.options.b.c=3", "env.options.a=2"])
    assert cfg.env.options == {"a": 2, "b": {"c": 3}}


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ValueError) as info:
        load_config(None, ["train.stepz=3"])
    message = str(info.value)
    assert "'train.stepz'" in message
    for key in ("method", "steps", "seed", "eval_every", "checkpoint_every", "engine"):
        assert key in message


def test_unknown_section_lists_sections(tmp_path):
    with pytest.raises(ValueError, match=r"'trian'.*env, model, prior, rollout.*train"):
        load_config(None, ["trian.steps=3"])
    with pytest.raises(ValueError, match=r"unknown config key 'optim.learning_rate'.*lr"):
        load_config(write(tmp_path, "optim:\n  learning_rate: 0.1\n"))
    with pytest.raises(ValueError, match="'bogus'"):
        config_from_dict({"bogus": {}})


@pytest.mark.parametrize(
    "override, pieces",
    [
        ("train.steps=abc", ["'train.steps'", "expected int", "'abc'"]),
        ("train.steps=2.5", ["'train.steps'", "expected int", "2.5"]),
        ("train.steps=true", ["'train.steps'", "expected int"]),
        ("optim.lr=[1]", ["'optim.lr'", "expected float", "[1]"]),
        ("optim.lr=nan", ["'optim.lr'", "expected float"]),
        ("env.options=3", ["'env.options'", "expected dict"]),
        ("model.name=[x]", ["'model.name'", "str | null"]),
        ("train.steps.x=1", ["'train.steps.x'", "not a mapping"]),
    ],
)
def test_wrong_types(override, pieces):
    with pytest.raises(ValueError) as info:
        load_config(None, [override])
    for piece in pieces:
        assert piece in str(info.value)


@pytest.mark.parametrize(
    "override, allowed",
    [
        ("train.method=grpo", "combined, rewardweaver, rw_outcome_grpo, rw_static_topk"),
        ("rewardweaver.selection=best", "attribution, static_topk, random, dynamic_topk"),
        ("sampler.kind=vade", "capability, outcome, uniform"),
        ("train.engine=fsdp", "torch, deepspeed"),
        ("rollout.engine=sglang", "hf, vllm"),
        ("judge.kind=claude", "rule, openai"),
        ("pool.skills=yes", "on, off"),
        ("model.dtype=float64", "float32, bfloat16, float16"),
    ],
)
def test_enumerations(override, allowed):
    key, _, value = override.partition("=")
    with pytest.raises(ValueError) as info:
        load_config(None, [override])
    assert f"'{key}'" in str(info.value) and allowed in str(info.value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    "override, match",
    [
        ("train.steps=-1", "'train.steps': must be >= 0"),
        ("rollout.group_size=0", "'rollout.group_size': must be > 0"),
        ("optim.lr=0", "'optim.lr': must be > 0"),
        ("advantage.lam=1.5", "'advantage.lam': must be <= 1"),
        ("loss.ratio_low=6", "ratio_low < ratio_high"),
        ("pool.eta_low=0.95", "eta_low < eta_high"),
        ("model.num_heads=3", "num_heads must divide hidden_size"),
    ],
)
def test_ranges(override, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, [override])


def test_malformed_overrides_and_files(tmp_path):
    for bad in ("train", "steps=1", ".steps=1", "train.=1"):
        with pytest.raises(ValueError, match="section.key=value"):
            load_config(None, [bad])
    with pytest.raises(ValueError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(write(tmp_path, "train: [\n"))
    with pytest.raises(ValueError, match="mapping of sections"):
        load_config(write(tmp_path, "- 1\n- 2\n", "list.yaml"))
    with pytest.raises(ValueError, match="'train'.*mapping of keys"):
        load_config(write(tmp_path, "train: 3\n", "scalar.yaml"))
    with pytest.raises(ValueError, match=r"'train.steps'.*bad.yaml"):
        load_config(write(tmp_path, "train: {steps: many}\n", "bad.yaml"))


def test_round_trip(tmp_path):
    cfg = load_config(
        None,
        [
            "pool.skills=off",
            "model.name=null",
            "optim.lr=1e-4",
            "env.options={level: 3, names: [a, b]}",
            "judge.model=1.10",
            "train.method=arise_no_skills",
        ],
    )
    path = tmp_path / "config.yaml"
    save_config(cfg, path)
    assert load_config(path) == cfg
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert config_from_dict(yaml.safe_load(path.read_text())) == cfg
    assert not [p for p in tmp_path.iterdir() if p.name != "config.yaml"]  # no temp files left
    dumped = config_to_dict(cfg)
    assert list(dumped) == [f.name for f in dataclasses.fields(Config)]


def test_no_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret")
    cfg = load_config(None, ["judge.kind=openai", "judge.model=gpt-4o-mini"])
    path = tmp_path / "config.yaml"
    save_config(cfg, path)
    text = path.read_text()
    assert "sk-very-secret" not in text and "api_key_env: OPENAI_API_KEY" in text
    assert not any("key" in f.name and f.name != "api_key_env" for f in dataclasses.fields(type(cfg.judge)))
    with pytest.raises(ValueError) as info:
        load_config(None, ["judge.api_key_env=sk-very-secret"])
    assert "sk-very-secret" not in str(info.value) and "NAME" in str(info.value)


def test_model_shorthand_sets_model_name():
    cfg = load_config(None, ["model=/models/my-chat-model", "model.dtype=bfloat16"])
    assert cfg.model.name == "/models/my-chat-model" and cfg.model.dtype == "bfloat16"
    with pytest.raises(ValueError, match="train"):
        load_config(None, ["train=arise"])  # only `model` has a short form
