#!/usr/bin/env bash
# Downloads, on a machine with PyPI, the wheels the device run (bench/gpu_check.sh) needs and the lent GPU
# machine lacks, into .whl/ (git-ignored; the device call carries it: carry [".whl"]).
#
#   bash bench/gpu_wheels.sh            # .whl/ for the nvidia-h200 machine: CPython 3.12, manylinux x86_64
#
# The GPU machine has no network at all, and its python3 (3.12) already holds torch, triton, transformers,
# tokenizers, numpy, pyyaml, tqdm, matplotlib, packaging (bench/device-packages.txt lists all). What it lacks:
# rwcore's runtime dependencies not in that list (openai), the benchmark's peer (liger-kernel), and their
# requirements, followed transitively through the metadata of the versions installed in this checkout's
# .venv (the versions the test suite runs), with markers evaluated for CPython 3.12 on Linux x86_64.
# vLLM is not carried: its wheel and its CUDA dependencies are hundreds of MB against the 64 MiB the device
# call may carry (gpu_check.sh reports its step as skipped there). Wheels of an earlier run that are no
# longer needed are removed, so .whl/ holds one version of each (two stop the install there).
# Environment: RWCORE_PYTHON (default .venv/bin/python) - the Python whose pip downloads and whose
# installed versions are carried.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${RWCORE_PYTHON:-.venv/bin/python}"
dest=.whl
limit_mib=64

# Never committed: ignored by .gitignore and by this clone's .git/info/exclude.
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"

# name==version for every distribution to carry (roots: liger-kernel and rwcore's dependencies).
mapfile -t wanted < <("$python" - bench/device-packages.txt <<'EOF'
import importlib.metadata as md
import re
import sys
import tomllib

from packaging.markers import default_environment
from packaging.requirements import Requirement


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


on_device = {norm(line.strip()) for line in open(sys.argv[1]) if line.strip() and not line.startswith("#")}
environment = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
               "implementation_name": "cpython", "platform_python_implementation": "CPython",
               "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
               "os_name": "posix", "extra": ""}
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
todo = [Requirement(r) for r in project["dependencies"]] + [Requirement("liger-kernel")]
carried, assumed = {}, {}
while todo:
    requirement = todo.pop()
    name = norm(requirement.name)
    if requirement.marker is not None and not requirement.marker.evaluate(environment):
        continue
    if name in on_device:
        if str(requirement.specifier):
            assumed.setdefault(name, set()).add(str(requirement.specifier))
        continue
    if name in carried:
        continue
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        sys.exit(f"gpu_wheels.sh: {requirement} is needed on the device but not installed here; install it "
                 f"in {sys.executable} (the carried versions are the ones tested here)")
    if version not in requirement.specifier:
        sys.exit(f"gpu_wheels.sh: {requirement} is needed, but {name} {version} is installed here")
    carried[name] = version
    todo.extend(Requirement(r) for r in (md.requires(name) or []))
for name, specs in sorted(assumed.items()):
    print(f"# assumed on the device (not carried): {name}{','.join(sorted(specs))}", file=sys.stderr)
for name, version in sorted(carried.items()):
    print(f"{name}=={version}")
EOF
)
[ "${#wanted[@]}" -gt 0 ] || { echo "gpu_wheels.sh: nothing to carry?" >&2; exit 1; }

mkdir -p "$dest"
platforms=()
for tag in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
           manylinux_2_34 manylinux_2_35 manylinux_2_39; do platforms+=(--platform "${tag}_x86_64"); done
keep=()
for spec in "${wanted[@]}"; do
  echo "[gpu_wheels] $spec"
  "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp "${platforms[@]}" -d "$dest" "$spec"
  # The wheel just saved: its file name starts with the name (underscores for dashes, any case) and version.
  stem="$(echo "${spec%%==*}" | tr '-' '_')-${spec##*==}-"
  found="$(cd "$dest" && ls | grep -i -- "^${stem}" | head -1)"
  [ -n "$found" ] || { echo "gpu_wheels.sh: no wheel for $spec in $dest" >&2; exit 1; }
  keep+=("$found")
done
for file in "$dest"/*; do  # one version of each: drop what this run did not ask for
  name="$(basename "$file")"
  printf '%s\n' "${keep[@]}" | grep -qxF "$name" || { echo "[gpu_wheels] removing stale $name"; rm -f "$file"; }
done

echo
echo "wheels in $dest/ (CPython 3.12, manylinux x86_64):"
(cd "$dest" && du -b -- * | sort -k2 | awk '{ printf "  %9d  %s\n", $1, $2 }')
wheels=$(du -cb "$dest"/* | tail -1 | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | awk '$2 == "total" { sum += $1 } END { print sum }')
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | awk '$2 == "total" { sum += $1 } END { print sum + 0 }')
total=$(( wheels + tree + untracked ))
echo "wheels $wheels bytes; tracked tree $tree bytes; untracked, not ignored $untracked bytes;" \
     "together $total bytes = $(( total / 1048576 )) MiB of the ${limit_mib} MiB a device call carries"
if [ "$total" -ge $(( limit_mib * 1048576 * 9 / 10 )) ]; then
  echo "gpu_wheels.sh: over 90 % of the ${limit_mib} MiB limit" >&2; exit 1
fi
