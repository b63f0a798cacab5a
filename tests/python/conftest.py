"""Shared fixtures for the Python tests: the device(s) to run on and a swap directory."""
import importlib.util
import os
import pathlib
import shutil
import sys

# Before torch initialises CUDA: cuBLAS reductions are repeatable only with a fixed workspace,
# and the exactness tests compare runs bit for bit.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest  # noqa: E402
import torch  # noqa: E402

# CTest sets PYTHONPATH; a plain `pytest tests/python` from the source tree finds the package here.
if importlib.util.find_spec("teraio") is None:
    sys.path.append(str(pathlib.Path(__file__).resolve().parents[2] / "python"))

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", "cuda"] if CUDA else ["cpu"]

requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def skip_on_cuda(device: str, why: str) -> None:
    """Skips the running test on CUDA devices, saying why."""
    if torch.device(device).type == "cuda":
        pytest.skip(why)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def swap_dir(tmp_path: pathlib.Path):
    """A directory for swap files, emptied after the test: swap files are preallocated, and
    pytest keeps the temporary directories of its last runs."""
    path = tmp_path / "swap"
    path.mkdir()
    yield path
    shutil.rmtree(path)
