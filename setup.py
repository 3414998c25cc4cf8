"""Builds rwcore and its C++ extension rwcore._evidence through CMake.

The build follows pybind11's cmake_example: setuptools hands each
CMakeExtension to CMake, which writes the module where setuptools expects it
(inside rwcore/ for an editable install, in the wheel otherwise).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str, source_dir: Path = ROOT) -> None:
        super().__init__(name, sources=[])
        self.source_dir = source_dir


class CMakeBuild(build_ext):
    def build_extension(self, ext: CMakeExtension) -> None:
        output_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_type = "Debug" if self.debug else os.environ.get("RWCORE_BUILD_TYPE", "Release")
        import pybind11

        configure = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={output_dir}{os.sep}",
            f"-DCMAKE_BUILD_TYPE={build_type}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        ]
        build = ["--config", build_type, "--parallel", str(os.cpu_count() or 1)]
        if "CMAKE_GENERATOR" not in os.environ:
            try:
                import ninja  # noqa: F401

                configure += ["-GNinja"]
            except ImportError:
                pass
        build_dir = Path(self.build_temp) / ext.name
        # A cache from an earlier build points at that build's isolated
        # environment (its ninja, its pybind11), which pip has since deleted.
        shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cmake", str(ext.source_dir), *configure], cwd=build_dir, check=True)
        subprocess.run(["cmake", "--build", ".", *build], cwd=build_dir, check=True)


def mapped_packages(folder: str, name: str) -> list[str]:
    """Packages found under `folder`, renamed to live under `name` (kernels/x -> rwcore.kernels.x)."""
    found = find_packages(where=str(ROOT), include=[folder, f"{folder}.*"])
    return [name + package[len(folder) :] for package in found]


setup(
    packages=(
        find_packages(where=str(ROOT), include=["rwcore", "rwcore.*"])
        + mapped_packages("kernels", "rwcore.kernels")
        + mapped_packages("trainer", "rwcore.trainer")
    ),
    # Only the top-level name rwcore is installed: a top-level `kernels` or
    # `trainer` would shadow other packages.
    package_dir={
        "rwcore": "rwcore",
        "rwcore.kernels": "kernels",
        "rwcore.trainer": "trainer",
    },
    package_data={
        "rwcore.judges": ["prompts/*.md"],
        # the reading priors that ship (trainer/prior/shipped/<env>-<key>/: model.pt, prior.json, manifest.json)
        "rwcore.trainer": [
            "configs/*.yaml",
            "envs/social/*.json",
            "envs/sotopia/profiles/*.jsonl",
            "prior/shipped/*/*.pt",
            "prior/shipped/*/*.json",
        ],
    },
    ext_modules=[CMakeExtension("rwcore._evidence")],
    cmdclass={"build_ext": CMakeBuild},
)
