"""The reading prior's pretraining, cache and run integration (rwcore.trainer.prior), on a tiny model.

A tiny prior (one layer of 16, 12 steps) cannot learn to read; these tests check the mechanics: determinism,
the cache and its key, damage and kill handling, the refusals, and that runs start from the prior.
"""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch
from _util import PRIOR_RUN, TINY_MODEL, TINY_PRIOR, ablate_command, child_env, prior_config

from rwcore.trainer import checkpoint as ckpt
from rwcore.trainer import cli, envs
from rwcore.trainer.config import load_config
from rwcore.trainer.prior import ensure_prior, prior_spec, resolve_init
from rwcore.trainer.prior import pretrain as pretrain_module

ENV = envs.make("negotiation")


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_pretraining_is_deterministic_from_its_seed(tmp_path):
    first = pretrain_module.pretrain(prior_config(tmp_path / "cache"), ENV, progress=False, log=lambda line: None)[0]
    again = pretrain_module.pretrain(prior_config(tmp_path / "cache"), ENV, progress=False, log=lambda line: None)[0]
    other = pretrain_module.pretrain(
        prior_config(tmp_path / "cache", "prior.seed=1"), ENV, progress=False, log=lambda line: None
    )[0]
    assert same_weights(first, again)
    assert not same_weights(first, other)


def test_cached_prior_is_reused_and_keyed_by_what_it_depends_on(tmp_path, monkeypatch):
    lines = []
    built = ensure_prior(prior_config(tmp_path / "cache"), ENV, progress=False, log=lines.append)
    assert (built.folder / "model.pt").is_file() and (built.folder / "prior.json").is_file()
    ckpt.verify(built.folder)
    report = json.loads((built.folder / "prior.json").read_text())
    assert report["key"] == built.key and report["spec"]["prior"]["steps"] == 12
    assert report["machine"]["torch"] == torch.__version__ and len(report["curve"]) >= 1
    assert 0 <= report["probe"]["heldout"]["with"] <= 1

    def no_training(*args, **kwargs):
        raise AssertionError("pretrained again although the cache holds the prior")

    monkeypatch.setattr(pretrain_module, "pretrain", no_training)
    again = ensure_prior(prior_config(tmp_path / "cache"), ENV, progress=False, log=lines.append)
    assert again.folder == built.folder and same_weights(again.state_dict, built.state_dict)
    # every setting of the spec changes the key (and so the folder)
    keys = {built.key}
    for extra in (
        ["prior.seed=1"],
        ["prior.lr=1e-3"],
        ["model.num_heads=4"],
        ["model.max_length=200"],
        ["env.options.max_turns=5"],
    ):
        cfg = prior_config(tmp_path / "cache", *extra)
        keys.add(pretrain_module._key(prior_spec(cfg, envs.make("negotiation", **cfg.env.options))))
    assert len(keys) == 6
    # ... but not where the cache lives
    assert pretrain_module._key(prior_spec(prior_config("/elsewhere"), ENV)) == built.key


@pytest.mark.parametrize("damage", ["flip", "truncate", "key", "manifest"])
def test_damaged_or_mismatched_cache_is_rebuilt_naming_it(tmp_path, damage):
    built = ensure_prior(prior_config(tmp_path / "cache"), ENV, progress=False, log=lambda line: None)
    model = built.folder / "model.pt"
    if damage == "flip":
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0xFF
        model.write_bytes(bytes(data))
    elif damage == "truncate":
        model.write_bytes(model.read_bytes()[:100])
    elif damage == "key":  # a consistent folder whose prior.json is another key's (the manifest rewritten to match)
        report = json.loads((built.folder / "prior.json").read_text())
        report["key"] = "0" * 20
        (built.folder / "prior.json").write_text(json.dumps(report))
        (built.folder / ckpt.MANIFEST).unlink()
        ckpt.write_manifest(built.folder, 12)
    else:
        (built.folder / ckpt.MANIFEST).write_text("{not json")
    lines = []
    rebuilt = ensure_prior(prior_config(tmp_path / "cache"), ENV, progress=False, log=lines.append)
    damaged = [line for line in lines if "is damaged" in line]
    assert len(damaged) == 1 and str(built.folder) in damaged[0] and "rebuilding" in damaged[0]
    assert same_weights(rebuilt.state_dict, built.state_dict)
    ckpt.verify(rebuilt.folder)


def test_a_failed_write_leaves_nothing_a_later_run_would_load(tmp_path, monkeypatch):
    def fail(folder, step):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "write_manifest", fail)
    lines = []
    prior = ensure_prior(prior_config(tmp_path / "cache"), ENV, progress=False, log=lines.append)
    warned = [line for line in lines if "could not cache" in line]
    assert prior.folder is None and len(warned) == 1  # the run goes on with the prior in memory, uncached
    assert list((tmp_path / "cache").iterdir()) == [next((tmp_path / "cache").glob(".*.lock"))]


def test_a_killed_rw_pretrain_leaves_no_prior_and_the_next_build_cleans_up(tmp_path):
    """SIGKILL a real `rw pretrain` while it trains (and a staging folder such a kill leaves while writing):
    the cache holds no prior, and the next build removes the staging folder and writes an intact one."""
    cache = tmp_path / "cache"
    argv = [
        sys.executable,
        "-m",
        "rwcore.trainer",
        "pretrain",
        "--quiet",
        *TINY_MODEL,
        "prior.steps=100000",
        "prior.batch_size=8",
        f"prior.cache_dir={cache}",
    ]
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        if "rw pretrain: step" in line:
            break
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not [p for p in cache.iterdir() if not p.name.startswith(".")]
    cfg = prior_config(tmp_path / "cache")
    name = f"negotiation-{pretrain_module._key(prior_spec(cfg, ENV))}"
    (cache / f".{name}.99999.tmp").mkdir()
    (cache / f".{name}.99999.tmp" / "model.pt").write_bytes(b"half")
    prior = ensure_prior(cfg, ENV, progress=False, log=lambda line: None)
    assert prior.folder.name == name and not list(cache.glob("*.tmp"))
    ckpt.verify(prior.folder)


def test_concurrent_builds_train_once(tmp_path):
    """Two processes asking for the same prior at once: one trains, the other waits and loads it."""
    code = (
        "import sys; from rwcore.trainer import envs; from rwcore.trainer.config import load_config; "
        "from rwcore.trainer.prior import ensure_prior; "
        "p = ensure_prior(load_config(None, sys.argv[1:]), envs.make('negotiation'), progress=False); "
        "print(p.key, p.report['seconds'])"
    )
    argv = [
        sys.executable,
        "-c",
        code,
        *TINY_MODEL,
        "prior.steps=150",
        "prior.batch_size=8",
        f"prior.cache_dir={tmp_path / 'cache'}",
    ]
    env = child_env()
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(0.5)
    second = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    outputs = [p.communicate(timeout=600) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outputs
    assert outputs[0][0] == outputs[1][0]  # the same key and the same report: one training
    trained = sum("pretraining the reading prior" in err for _, err in outputs)
    waited = sum("waiting for another process" in err for _, err in outputs)
    assert trained == 1 and waited == 1, outputs


def test_model_init_resolution_and_refusals():
    assert resolve_init(load_config(None, []), ENV) == "pretrained"
    assert resolve_init(load_config(None, ["model.init=random"]), ENV) == "random"
    tools = envs.make("tools", num_train=4, num_eval=2)
    assert resolve_init(load_config(None, ["env.name=tools"]), tools) == "random"  # no guidance language
    with pytest.raises(ValueError, match=r"'model.init'.*env.name='tools' has none"):
        resolve_init(load_config(None, ["env.name=tools", "model.init=pretrained"]), tools)
    with pytest.raises(ValueError, match=r"'model.init'.*applies to the built-in model only"):
        load_config(None, ["model.name=Qwen/Qwen3-0.6B", "model.init=pretrained"])
    assert resolve_init(load_config(None, ["model.name=Qwen/Qwen3-0.6B"]), ENV) is None
    with pytest.raises(ValueError, match=r"'model.init'.*not an allowed value"):
        load_config(None, ["model.init=scratch"])


def test_rw_pretrain_and_rw_probe_commands(tmp_path, capsys):
    cache = f"prior.cache_dir={tmp_path / 'cache'}"
    assert cli.main(["pretrain", "--quiet", *TINY_PRIOR, cache]) == 0
    out = capsys.readouterr().out
    assert "prior:" in out and "held-out pairings" in out and "when the buyer agrees say confirm" in out
    assert cli.main(["pretrain", "--json", *TINY_PRIOR, cache]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"folder", "key", "curve", "probe", "machine", "spec"} <= set(report)
    assert cli.main(["probe", *TINY_PRIOR, cache]) == 0
    assert "held-out pairings" in capsys.readouterr().out
    assert cli.main(["pretrain", "model.name=Qwen/Qwen3-0.6B"]) == 2
    assert "'model.name'" in capsys.readouterr().err
    assert cli.main(["pretrain", "model.init=random"]) == 2
    assert "'model.init'" in capsys.readouterr().err
    assert cli.main(["pretrain", "env.name=tools"]) == 2
    assert "guidance language" in capsys.readouterr().err


def test_every_variant_starts_rl_from_the_same_prior(tmp_path):
    """A fresh run with model.init=pretrained starts from the cached prior's weights whatever its seed and
    variant, records it (config.yaml, prior.json), and resumes without it; model.init=random starts from
    its own seed's random weights."""
    from rwcore.trainer.trainer import Trainer

    cache = f"prior.cache_dir={tmp_path / 'cache'}"
    prior = ensure_prior(prior_config(tmp_path / "cache"), ENV, progress=False, log=lambda line: None)
    starts = {}
    for method, seed in (("outcome_only", 0), ("arise", 1), ("rewardweaver", 2)):
        trainer = Trainer(
            load_config(None, [*TINY_PRIOR, cache, *PRIOR_RUN, f"train.method={method}", f"train.seed={seed}"]),
            tmp_path / method,
            quiet=True,
        )
        trainer.setup()
        starts[method] = {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}
        trainer.cleanup()
        assert load_config(str(tmp_path / method / "config.yaml")).model.init == "pretrained"
        record = json.loads((tmp_path / method / "prior.json").read_text())
        assert record["key"] == prior.key and record["folder"] == str(prior.folder)
    assert all(same_weights(weights, prior.state_dict) for weights in starts.values())
    random_runs = []
    for seed in (0, 1):
        trainer = Trainer(
            load_config(None, [*TINY_PRIOR, cache, *PRIOR_RUN, "model.init=random", f"train.seed={seed}"]),
            tmp_path / f"random{seed}",
            quiet=True,
        )
        trainer.setup()
        random_runs.append(trainer.policy.model.state_dict())
        trainer.cleanup()
        assert not (tmp_path / f"random{seed}" / "prior.json").exists()
    assert not same_weights(random_runs[0], prior.state_dict) and not same_weights(*random_runs)
    # a run resumes from its checkpoint, never from the prior: the cache may be gone
    run = tmp_path / "resumed"
    argv = ["train", "--out", str(run), "--quiet", *TINY_PRIOR, cache, *PRIOR_RUN, "train.method=outcome_only"]
    assert cli.main(argv) == 0
    for path in (tmp_path / "cache").iterdir():
        if path.is_dir():
            for file in path.iterdir():
                file.unlink()
            path.rmdir()
    trainer = Trainer.resume(str(run), quiet=True)
    trainer.setup()
    assert trainer.prior is None and not any((tmp_path / "cache").glob("negotiation-*"))
    trainer.cleanup()
    assert cli.main(["probe", str(run)]) == 0


def test_rw_ablate_builds_the_prior_once_and_every_run_starts_from_it(tmp_path):
    out = tmp_path / "abl"
    cache = f"prior.cache_dir={tmp_path / 'cache'}"
    command = ablate_command(
        out,
        *TINY_PRIOR,
        cache,
        *PRIOR_RUN[:-1],
        paper="arise",
        variants="arise,outcome_only",
        seeds="0,1",
        steps=1,
        jobs=2,
    )
    done = subprocess.run(command, capture_output=True, text=True, env=child_env(), timeout=900)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("pretraining the reading prior") == 1
    assert "every run starts from the reading prior" in done.stderr
    runs = sorted((out / "runs").iterdir())
    assert len(runs) == 4
    keys = {json.loads((run / "prior.json").read_text())["model_sha256"] for run in runs}
    assert len(keys) == 1
    assert "pretraining" not in "".join((run / "ablation.log").read_text() for run in runs)


def test_the_prior_key_sees_code_changes_but_not_comments_docstrings_or_formatting():
    digest = pretrain_module._code_digest
    base = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    assert digest(base) == digest("def f( x ):\n    # a comment\n    return (x+1)\n")
    assert digest(base) == digest("def f(x):\n    '''Another doc.'''\n    return x + 1\n")
    assert digest(base) != digest('def f(x):\n    """Doc."""\n    return x + 2\n')
    assert digest('s = "ab"\n') == digest('s = ("a"\n     "b")\n')  # implicit concatenation is one constant
