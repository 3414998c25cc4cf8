#!/usr/bin/env bash
# Installs what the device run needs into an existing Python that has CUDA torch, without any network:
# the wheels carried in .whl/ (bench/gpu_wheels.sh) into SITE, then rwcore from this source tree.
#
#   bash bench/gpu_install.sh PYTHON SITE     # run by bench/gpu_check.sh; afterwards use PYTHONPATH=SITE:<repo root>
#
# rwcore: `pip install --no-index --no-deps --no-build-isolation -e .` with the setuptools, pybind11, cmake and
# ninja the Python already has (the GPU machine's image has all four). When that fails (a setuptools older
# than pyproject.toml's PEP 639 license needs, say), the C++ extension is built in place with CMake and the two
# mapped packages are linked where the import system finds them (rwcore/kernels -> kernels, rwcore/trainer ->
# trainer, as setup.py's package_dir maps them), so PYTHONPATH=<repo root> imports the tree as installed.
# Nothing here reaches a package index: pip runs with --no-index.
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
python="${1:?usage: gpu_install.sh PYTHON SITE}"
site="${2:?usage: gpu_install.sh PYTHON SITE}"
export PATH="$(dirname "$python"):$PATH"  # the environment's own cmake and ninja (pip packages)
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1

shopt -s nullglob
wheels=(.whl/*.whl)
if [ "${#wheels[@]}" -gt 0 ]; then
  echo "[install] ${#wheels[@]} carried wheels -> $site"
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}" \
    || { echo "[install] FAILED: pip could not install the carried wheels" >&2; exit 1; }
else
  echo "[install] no carried wheels in .whl/ (bench/gpu_wheels.sh makes them): liger-kernel and openai are what they add"
fi

importable() {  # rwcore's C++ extension and its mapped packages, seen from outside the tree (torch is not imported)
  (cd / && PYTHONPATH="$site:$repo${PYTHONPATH:+:$PYTHONPATH}" "$python" -c "
import importlib.util, rwcore, rwcore._evidence
missing = [name for name in ('rwcore.kernels', 'rwcore.trainer') if importlib.util.find_spec(name) is None]
assert not missing, f'{missing} not found'
print('[install] rwcore from', rwcore.__file__, 'with', rwcore._evidence.__file__)")
}
if importable 2>/dev/null; then echo "[install] rwcore already importable"; exit 0; fi

if [ "${GPU_INSTALL_IN_PLACE:-0}" != 1 ]; then
  echo "[install] pip install --no-index --no-deps --no-build-isolation -e ."
  if "$python" -m pip install -q --no-index --no-deps --no-build-isolation -e . && importable; then exit 0; fi
  echo "[install] the editable install failed; building the extension in place instead"
fi

build="${TMPDIR:-/tmp}/rwcore-build"
rm -rf "$build"
pybind11_dir="$("$python" -m pybind11 --cmakedir)" || { echo "[install] FAILED: $python has no pybind11" >&2; exit 1; }
generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$repo" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$repo/rwcore/" \
      -DPython_EXECUTABLE="$python" -Dpybind11_DIR="$pybind11_dir" \
  && cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 4)" \
  || { echo "[install] FAILED: the C++ extension rwcore._evidence did not build (a C++20 compiler is needed)" >&2; exit 1; }
for mapped in kernels trainer; do
  [ -e "rwcore/$mapped" ] || ln -s "../$mapped" "rwcore/$mapped"
done
echo "[install] linked rwcore/kernels -> kernels and rwcore/trainer -> trainer (untracked; remove them after the run)"
importable
