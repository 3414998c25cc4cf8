"""Reading priors that ship with the package, and the line that says why a prior must be built.

Layout: `rwcore/trainer/prior/shipped/<env>-<key>/` holds what a cache entry holds (`model.pt`, `prior.json`,
`manifest.json`; `rwcore.trainer.prior.cache`), for the configurations in `SHIPPED_CONFIGS`: the embedded
default's learnable tier, its hard tier (`--config arise-hard`) and the learnable tier with `model.head_dim=64`
(the vLLM path's). `scripts/ship_priors.py` copies them from a cache entry built on one machine
(`REBUILD_COMMAND`); a test recomputes their keys and fails, naming that command, when code changed a key
without the shipped folder being rebuilt.

`ensure_prior` reads a shipped entry in place, after the user's cache and before building: never copied, never
written (the package folder belongs to whoever installed it). Trust: such an entry is trusted as the package's
code is, since whoever can write it can write the code that reads it: it is used when it is owned by the owner
of this module's file or by root, and group or others may write it only where they may write this module
(`check_like_code`). Like a cache entry it is read through descriptors that follow no link and verified
against its manifest and key; an entry that fails is skipped with one line (reinstall rwcore) and the prior is
built instead.

When the prior must be built, `build_reason` names what changed the key relative to the nearest shipped or
cached prior of the same environment (a config key and both values, or the code), and `build_estimate` how
long it should take, from the fastest recorded build of that environment's priors (its machine and threads named).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

__all__ = [
    "REBUILD_COMMAND",
    "SHIPPED",
    "SHIPPED_CONFIGS",
    "build_estimate",
    "build_reason",
    "reports",
    "ShippedPriorError",
    "build_line",
    "check_like_code",
]

SHIPPED = Path(__file__).resolve().parent / "shipped"
REBUILD_COMMAND = "OMP_NUM_THREADS=1 .venv/bin/python scripts/ship_priors.py"
# (the shipped config name or None for the embedded default, overrides): the configurations whose prior ships
SHIPPED_CONFIGS: tuple[tuple[str | None, tuple[str, ...]], ...] = (
    (None, ()),
    ("arise-hard", ()),
    (None, ("model.head_dim=64",)),
)
_CODE_DIGEST = 64  # hex characters of the spec's "code" that digest rwcore's own modules; the rest, the env's


class ShippedPriorError(ValueError):
    """A shipped entry that is not trusted like the package's code."""


def check_like_code(info: os.stat_result, path: Path, entry: Path | None = None) -> None:
    """Raises ShippedPriorError unless a shipped file or folder (its stat) is as trusted as this module's code:
    owned by the owner of this module's file or by root, writable by group or others only where it is."""
    code = os.stat(__file__)
    if info.st_uid not in (code.st_uid, 0):
        raise ShippedPriorError(
            f"{path} is owned by uid {info.st_uid}, not by the owner of rwcore's code (uid {code.st_uid}) or root"
        )
    if stat.S_IMODE(info.st_mode) & 0o022 & ~stat.S_IMODE(code.st_mode):
        raise ShippedPriorError(
            f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}) where rwcore's code is not"
        )


def reports(root: Path, env_name: str, kind: str, exclude: str = "") -> list[tuple[str, Path, dict]]:
    """(kind, folder, prior.json) of every entry of `env_name` in `root` (shipped or a cache) but `exclude`
    whose prior.json reads as a JSON object with a spec, opened without following a link; for the build line
    only (the weights a run starts from are read through the cache module's checks)."""
    found = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return found
    for name in names:
        if not name.startswith(f"{env_name}-") or name == exclude:
            continue
        report = _report(root / name)
        if report is not None:
            found.append((kind, root / name, report))
    return found


def _report(folder: Path) -> dict | None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        entry = os.open(folder, flags | os.O_DIRECTORY)
        try:
            handle = os.open("prior.json", flags | os.O_NONBLOCK, dir_fd=entry)
        finally:
            os.close(entry)
        with os.fdopen(handle, "rb") as stream:
            report = json.loads(stream.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return report if isinstance(report, dict) and isinstance(report.get("spec"), dict) else None


def _flat(spec: dict, prefix: str = "") -> dict:
    out = {}
    for name, value in spec.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def _differences(spec: dict, other: dict) -> list[str]:
    """What makes `spec` another prior than `other`'s spec, in the user's terms: a config key with its value
    (the other's value follows in `build_reason`), or a sentence about the environment or the code."""
    mine, theirs = _flat(spec), _flat(other)
    keys, said = [], set()
    for path in sorted(set(mine) | set(theirs)):
        if mine.get(path) == theirs.get(path):
            continue
        head = path.split(".", 1)[0]
        if head in ("model", "prior"):
            name = path
        elif path == "corpus.seed":
            name = "prior.seed"
        elif path == "corpus.max_length":
            name = "model.max_length"
        elif path == "code":
            code, other_code = str(mine.get(path, "")), str(theirs.get(path, ""))
            if code[:_CODE_DIGEST] != other_code[:_CODE_DIGEST]:
                keys.append("rwcore's code of the prior (corpus, pretraining, policy or prompt) changed")
            if code[_CODE_DIGEST:] != other_code[_CODE_DIGEST:]:
                keys.append("the environment's code changed")
            continue
        elif head in ("env", "base_prompt", "max_turns", "vocabulary", "language"):
            name = f"the environment's {'turn limit' if head == 'max_turns' else head.replace('_', ' ')}"
            if name not in said:
                said.add(name)
                keys.append(f"{name} differs (env.name / env.options)")
            continue
        else:
            name = f"the prior's {path}"
        if name not in said:
            said.add(name)
            keys.append((name, mine.get(path), theirs.get(path)))
    return keys


def _value(value) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _nearest(spec: dict, candidates: list[tuple[str, Path, dict]]):
    """The candidate (kind, folder, report) of the same environment whose spec differs from `spec` in the
    fewest things, shipped before cached on a tie; None when there is none."""
    same = [c for c in candidates if c[2]["spec"].get("env") == spec.get("env")]
    if not same:
        return None, []
    ranked = sorted(same, key=lambda c: (len(_differences(spec, c[2]["spec"])), c[0] != "shipped", str(c[1])))
    return ranked[0], _differences(spec, ranked[0][2]["spec"])


def build_reason(spec: dict, candidates: list[tuple[str, Path, dict]]) -> str:
    """Why no prior fits `spec`: what differs from the nearest candidate ("shipped" or "cached", its folder,
    its prior.json), e.g. "prior.seed=1 differs from the shipped prior's 0 (nearest: the shipped prior
    negotiation-8799...)"."""
    nearest, differences = _nearest(spec, candidates)
    if nearest is None:
        return f"no shipped or cached prior exists for env.name={spec.get('env')!r}"
    kind, folder, _ = nearest
    if not differences:
        return f"the {kind} prior {folder.name} holds the same settings under another key"
    parts = []
    for difference in differences:
        if isinstance(difference, tuple):
            name, mine, theirs = difference
            if name.startswith("the prior's "):
                parts.append(f"{name} is {_value(mine)} where the {kind} prior's is {_value(theirs)}")
            else:
                parts.append(f"{name}={_value(mine)} differs from the {kind} prior's {_value(theirs)}")
        else:
            parts.append(difference)
    return f"{'; '.join(parts)} (nearest: the {kind} prior {folder.name})"


def build_estimate(spec: dict, candidates: list[tuple[str, Path, dict]]) -> str:
    """How long the build should take: the fastest recorded build among the candidates of the same environment
    (seconds per step x example, the least loaded measure), times this spec's steps x batch size, with the
    machine and thread count that took it; "" when none records its time."""
    rates = []
    for kind, _, report in candidates:
        try:
            theirs = report["spec"]["prior"]
            if report["spec"].get("env") == spec.get("env"):
                rates.append((float(report["seconds"]) / (theirs["steps"] * theirs["batch_size"]), kind, report))
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue
    if not rates:
        return ""
    rate, kind, report = min(rates, key=lambda r: r[0])
    machine = report.get("machine") or {}
    where = ", ".join(str(machine[k]) for k in ("cpu", "cpu_capability") if machine.get(k)) or "an unrecorded CPU"
    minutes = max(1, round(rate * spec["prior"]["steps"] * spec["prior"]["batch_size"] / 60))
    return (
        f"about {minutes} min (the fastest recorded build, of a {kind} prior: {report['seconds']:.0f} s for "
        f"{report['spec']['prior']['steps']} steps on {report.get('threads', '?')} thread(s) of {where}; longer on "
        "a slower or loaded machine)"
    )


def build_line(spec: dict, cache_root: Path, name: str) -> str:
    """The line printed before a prior is built: its entry `name`, why (`build_reason` against the shipped
    priors and the entries of `cache_root`) and about how long it takes (`build_estimate`)."""
    candidates = reports(SHIPPED, spec.get("env", ""), "shipped")
    candidates += reports(cache_root, spec.get("env", ""), "cached", exclude=name)
    estimate = build_estimate(spec, candidates)
    return f"rw: building the reading prior {name}: {build_reason(spec, candidates)}" + (
        f"; {estimate}" if estimate else ""
    )
