"""The reading priors that ship with rwcore (rwcore.trainer.prior.shipped).

The shipped folders must hold the priors the current code would build: their keys are recomputed here from the
shipped configurations and compared with the folders' names and specs, so code that changes a key without the
shipped prior being rebuilt fails, naming the command that rebuilds them. A fresh cache starts from the shipped
prior without pretraining; a cache entry comes first; a shipped entry that fails its manifest or is writable by
someone who cannot write rwcore's code is not used. Pretraining is replaced by a stand-in where only the choice
of prior matters.
"""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer import envs
from rwcore.trainer.config import load_config
from rwcore.trainer.prior import ensure_prior, prior_record, prior_spec, shipped
from rwcore.trainer.prior import pretrain as pretrain_module

REPO = Path(__file__).resolve().parents[3]
# the configurations whose priors ship, written out here rather than read from the module under test
CONFIGS = {
    "the embedded default": (None, []),
    "--config arise-hard": (REPO / "trainer" / "configs" / "arise-hard.yaml", []),
    "model.head_dim=64": (None, ["model.head_dim=64"]),
}
WEIGHTS = {"w": torch.arange(6, dtype=torch.float32)}


def current(label):
    path, overrides = CONFIGS[label]
    config = load_config(path and str(path), overrides)
    env = envs.make(config.env.name, **dict(config.env.options))
    spec = prior_spec(config, env)
    return config, env, spec, f"{env.name}-{pretrain_module._key(spec)}"


def stand_in(config, env, *, progress=True, log=None):
    report = {"curve": [{"step": 1, "loss": 1.0}], "seconds": 0.0, "threads": 1, "machine": {}, "probe": {}}
    return {k: v.clone() for k, v in WEIGHTS.items()}, report


def no_pretraining(*args, **kwargs):
    raise AssertionError("pretrained although a shipped or cached prior has the key")


@pytest.mark.parametrize("label", list(CONFIGS))
def test_each_shipped_configuration_has_its_prior_shipped_under_its_current_key(label):
    _, _, spec, name = current(label)
    folder = shipped.SHIPPED / name
    assert folder.is_dir(), (
        f"no shipped prior for {label} under its current key ({name}): code or settings changed the key; "
        f"rebuild the shipped priors with: {shipped.REBUILD_COMMAND}"
    )
    ckpt.verify(folder)  # manifest: size and sha256 of model.pt and prior.json
    report = json.loads((folder / "prior.json").read_text())
    assert report["key"] == name.split("-", 1)[1] and report["spec"] == spec, shipped.REBUILD_COMMAND
    # where it was built: the machine and one thread (deterministic from its seed there), and its probe
    assert report["threads"] == 1 and report["machine"]["cpu_capability"] and report["machine"]["torch"]
    assert report["probe"]["heldout"]["pairs"] and report["probe"]["skills_summary"]["probed"] == 30
    if label != "model.head_dim=64":  # the tiers' priors read held-out pairings (head_dim=64's does not: docs)
        assert report["probe"]["heldout"]["with"] > 0.9 > 0.2 > report["probe"]["heldout"]["without"]


def test_nothing_else_ships():
    names = {current(label)[3] for label in CONFIGS}
    found = {path.name for path in shipped.SHIPPED.iterdir()}
    assert found == names, (
        f"stale shipped priors {sorted(found - names)}, missing {sorted(names - found)}: rebuild them with "
        f"{shipped.REBUILD_COMMAND}"
    )
    assert [(None, ()), ("arise-hard", ()), (None, ("model.head_dim=64",))] == list(shipped.SHIPPED_CONFIGS)


def test_a_fresh_cache_starts_from_the_shipped_prior_without_pretraining(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrain_module, "pretrain", no_pretraining)
    monkeypatch.setenv("RWCORE_CACHE", str(tmp_path / "cache"))
    config, env, _, name = current("--config arise-hard")
    lines = []
    prior = ensure_prior(config, env, log=lines.append)
    folder = shipped.SHIPPED / name
    assert (prior.source, prior.folder) == ("shipped", folder)
    assert lines == [f"rw: reading prior: shipped ({folder})"]
    assert not (tmp_path / "cache").exists()  # nothing written, not even the cache root
    data = (folder / "model.pt").read_bytes()
    assert prior.model_sha256 == hashlib.sha256(data).hexdigest()
    on_disk = torch.load(folder / "model.pt", weights_only=True)
    assert on_disk.keys() == prior.state_dict.keys()
    assert all(torch.equal(on_disk[k], prior.state_dict[k]) for k in on_disk)
    record = prior_record(prior)
    assert (record["source"], record["folder"], record["key"]) == ("shipped", str(folder), name.split("-", 1)[1])


def test_a_cache_entry_comes_first_and_rebuild_builds_one(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrain_module, "pretrain", stand_in)
    config, env, _, name = current("the embedded default")
    config.prior.cache_dir = str(tmp_path)
    built = ensure_prior(config, env, rebuild=True, progress=False, log=lambda line: None)
    assert (built.source, built.folder) == ("built", tmp_path / name)
    monkeypatch.setattr(pretrain_module, "pretrain", no_pretraining)
    cached = ensure_prior(config, env, log=lambda line: None)
    assert cached.source == "cached" and torch.equal(cached.state_dict["w"], WEIGHTS["w"])
    # a damaged entry of the cache: removed, and the shipped prior used
    (tmp_path / name / "model.pt").write_bytes(b"damaged")
    lines = []
    again = ensure_prior(config, env, log=lines.append)
    assert again.source == "shipped" and not (tmp_path / name).exists()
    assert "is damaged" in lines[0] and lines[1].startswith("rw: reading prior: shipped")


@pytest.mark.parametrize("damage", ["bytes", "group-writable"])
def test_a_shipped_prior_that_fails_its_checks_is_not_used(tmp_path, monkeypatch, damage):
    config, env, _, name = current("the embedded default")
    copy = tmp_path / "shipped"
    shutil.copytree(shipped.SHIPPED / name, copy / name)
    if damage == "bytes":
        data = bytearray((copy / name / "model.pt").read_bytes())
        data[len(data) // 2] ^= 1
        (copy / name / "model.pt").write_bytes(bytes(data))
        expected = "does not match its sha256"
    else:
        (copy / name / "model.pt").chmod(0o664)
        expected = "writable by group or others (mode 0664) where rwcore's code is not"
    monkeypatch.setattr(shipped, "SHIPPED", copy)
    monkeypatch.setattr(pretrain_module, "pretrain", stand_in)
    config.prior.cache_dir = str(tmp_path / "cache")
    lines = []
    prior = ensure_prior(config, env, progress=False, log=lines.append)
    assert prior.source == "built" and torch.equal(prior.state_dict["w"], WEIGHTS["w"])
    assert f"rw: the shipped prior {copy / name} is not used" in lines[0] and expected in lines[0], lines
    assert "reinstall rwcore" in lines[0]
    assert (copy / name / "model.pt").exists()  # left as it is


def test_the_build_line_names_the_setting_that_changed_the_key(tmp_path, monkeypatch):
    monkeypatch.setattr(pretrain_module, "pretrain", stand_in)
    config = load_config(None, ["prior.seed=1", f"prior.cache_dir={tmp_path}"])
    env = envs.make("negotiation")
    lines = []
    ensure_prior(config, env, progress=False, log=lines.append)
    default = current("the embedded default")[3]
    assert lines[0].startswith(
        f"rw: building the reading prior negotiation-{pretrain_module._key(prior_spec(config, env))}: "
        f"prior.seed=1 differs from the shipped prior's 0 (nearest: the shipped prior {default}); about "
    ), lines
    assert " min (the fastest recorded build" in lines[0]


def spec_of(**changes):
    spec = {
        "env": "negotiation",
        "max_turns": 6,
        "model": {"head_dim": None, "hidden_size": 64},
        "prior": {"seed": 0, "steps": 2000, "batch_size": 64},
        "corpus": {"seed": 0, "max_length": 256},
        "code": "a" * 64 + "b" * 64,
    }
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = spec
        for parent in parents:
            target = target[parent]
        target[last] = value
    return spec


def test_build_reason_and_estimate_against_the_nearest_prior():
    near = ("cached", Path("/c/negotiation-near"), {"spec": spec_of(), "seconds": 600.0, "threads": 1})
    far = ("shipped", Path("/s/negotiation-far"), {"spec": spec_of(model__hidden_size=32, max_turns=12)})
    other = ("shipped", Path("/s/tools-x"), {"spec": spec_of(env="tools"), "seconds": 1.0})
    wanted = spec_of(prior__seed=3, corpus__seed=3, code="a" * 64 + "c" * 64)
    assert shipped.build_reason(wanted, [far, near, other]) == (
        "the environment's code changed; prior.seed=3 differs from the cached prior's 0 "
        "(nearest: the cached prior negotiation-near)"
    )
    assert shipped.build_reason(spec_of(code="d" * 128), [near]) == (
        "rwcore's code of the prior (corpus, pretraining, policy or prompt) changed; the environment's code changed "
        "(nearest: the cached prior negotiation-near)"
    )
    assert shipped.build_reason(spec_of(max_turns=12), [near]).startswith(
        "the environment's turn limit differs (env.name / env.options)"
    )
    assert (
        shipped.build_reason(spec_of(env="social"), [near]) == "no shipped or cached prior exists for env.name='social'"
    )
    # 600 s for 2000 x 64 examples; 1000 x 128 examples is the same work: 10 min; the other env's record is ignored
    estimate = shipped.build_estimate(spec_of(prior__steps=1000, prior__batch_size=128), [near, far, other])
    assert estimate.startswith("about 10 min (the fastest recorded build, of a cached prior: 600 s for 2000 steps")
    assert shipped.build_estimate(spec_of(env="social"), [near]) == ""
