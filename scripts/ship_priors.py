"""Rebuilds the reading priors that ship with rwcore (trainer/prior/shipped/), from a checkout.

For each configuration of `rwcore.trainer.prior.shipped.SHIPPED_CONFIGS` (the embedded default, `--config
arise-hard`, the embedded default with `model.head_dim=64`) it computes the prior's key, takes the prior from the
cache (`~/.cache/rwcore/priors`, `$RWCORE_CACHE/priors` or --cache-dir), building it there first when it is not
cached (2,000 steps each: minutes per prior, the time `rw pretrain` reports), and copies its cache entry
(model.pt, prior.json, manifest.json, verified on the way) to trainer/prior/shipped/<env>-<key>/. Shipped folders
that no configuration's key names any more are removed. With --check it only says what is stale (exit 1).

Build them with one thread (OMP_NUM_THREADS=1), as shipped: pretraining is deterministic from its seed on one
machine and thread count, so `rw pretrain --rebuild` with one thread on the machine recorded in prior.json
gives the same weights.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/ship_priors.py [--check] [--rebuild] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "trainer" / "prior" / "shipped"
FILES = ("manifest.json", "model.pt", "prior.json")


def configurations(cache_dir: str | None = None):
    """(label, config, env, key) of each shipped configuration."""
    from rwcore.trainer import envs
    from rwcore.trainer.config import load_config
    from rwcore.trainer.prior.pretrain import _key, prior_spec
    from rwcore.trainer.prior.shipped import SHIPPED_CONFIGS

    for name, overrides in SHIPPED_CONFIGS:
        path = None if name is None else str(ROOT / "trainer" / "configs" / f"{name}.yaml")
        extra = [f"prior.cache_dir={cache_dir}"] if cache_dir else []
        config = load_config(path, [*overrides, *extra])
        config.model.init = "pretrained"
        env = envs.make(config.env.name, **dict(config.env.options))
        label = " ".join(([f"--config {name}"] if name else ["the embedded default"]) + list(overrides))
        yield label, config, env, _key(prior_spec(config, env))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which shipped priors are stale (exit 1)")
    parser.add_argument("--rebuild", action="store_true", help="build every prior again, even when cached")
    parser.add_argument("--cache-dir", help="the prior cache to take them from and build them in")
    args = parser.parse_args(argv)

    from rwcore.trainer import checkpoint as ckpt
    from rwcore.trainer.prior import ensure_prior

    wanted = {}
    for label, config, env, key in configurations(args.cache_dir):
        wanted[f"{env.name}-{key}"] = (label, config, env)
    present = {path.name for path in TARGET.iterdir() if path.is_dir()} if TARGET.is_dir() else set()
    stale = sorted(present - set(wanted))
    missing = sorted(set(wanted) - present)
    if args.check:
        for name in missing:
            print(f"missing: {name} ({wanted[name][0]})")
        for name in stale:
            print(f"stale: {name}")
        return 1 if missing or stale else 0
    TARGET.mkdir(parents=True, exist_ok=True)
    for name, (label, config, env) in wanted.items():
        if name in present and not args.rebuild:
            ckpt.verify(TARGET / name)
            print(f"{name}: shipped already ({label})")
            continue
        prior = ensure_prior(config, env, rebuild=args.rebuild, cache_required=True)
        if prior.source == "shipped":
            raise SystemExit(f"{name}: the shipped prior was found where a cache entry was expected")
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=TARGET))
        try:
            for file in FILES:
                shutil.copyfile(prior.folder / file, staging / file)
                (staging / file).chmod(0o644)
            staging.chmod(0o755)
            ckpt.verify(staging)
            if (TARGET / name).exists():
                shutil.rmtree(TARGET / name)
            staging.rename(TARGET / name)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        print(f"{name}: shipped from {prior.folder} ({label}; {prior.source}, sha256 {prior.model_sha256})")
    for name in stale:
        shutil.rmtree(TARGET / name)
        print(f"{name}: removed (no shipped configuration has its key)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
