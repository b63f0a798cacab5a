"""pip install --no-build-isolation .

Builds the native module teraio._native with CMake against the torch that this interpreter
imports (hence no build isolation: an isolated build would see no torch, or another one) and
packages it with the Python sources under python/teraio. Needs CMake >= 3.25, a C++20
compiler and torch's C++ headers (Debian: libtorch-dev; the pip wheels carry them).
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).parent.resolve()


class CMakeExtension(Extension):
    def __init__(self, name: str, target: str) -> None:
        super().__init__(name, sources=[])
        self.target = target


class CMakeBuild(build_ext):
    def build_extension(self, ext: CMakeExtension) -> None:
        build_dir = pathlib.Path(self.build_temp).resolve() / "cmake"
        configure = ["cmake", "-S", str(ROOT), "-B", str(build_dir),
                     f"-DCMAKE_BUILD_TYPE={os.environ.get('TERAIO_BUILD_TYPE', 'Release')}",
                     "-DTERAIO_PYTHON_INPLACE=OFF", "-DTERAIO_BUILD_TESTS=OFF", "-DTERAIO_BUILD_BENCHMARKS=OFF",
                     "-DTERAIO_WITH_TORCH=ON", f"-DPython3_EXECUTABLE={sys.executable}"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", ext.target, "-j", jobs], check=True)

        built = sorted((build_dir / "python" / "teraio").glob("_native*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one teraio/_native*.so in {build_dir}/python, found {built}")
        destination = pathlib.Path(self.get_ext_fullpath(ext.name))
        destination.parent.mkdir(parents=True, exist_ok=True)
        # The module's name carries torch's extension suffix, which is this interpreter's.
        shutil.copy2(built[0], destination.with_name(built[0].name))


def version() -> str:
    text = (ROOT / "python" / "teraio" / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE).group(1)


setup(
    name="teraio",
    version=version(),
    description="Lifetime-aware offloading of idle PyTorch tensors to host memory and SSDs during training",
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[CMakeExtension("teraio._native", target="teraio_torch_native")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["torch"],
    extras_require={"demo": ["tqdm"]},
    zip_safe=False,
)
