"""Files TeraIO writes load in the `safetensors` library and vice versa (where it is installed:
the GPU machine), every dtype both know, CPU and CUDA."""
import pytest
import torch

from teraio import safetensors as st

reference = pytest.importorskip("safetensors.torch")


def _tensors():
    g = torch.Generator().manual_seed(3)
    out = {
        "f32": torch.randn(17, 33, generator=g),
        "f64": torch.randn(5, generator=g, dtype=torch.float64),
        "f16": torch.randn(8, 8, generator=g).half(),
        "bf16": torch.randn(64, 3, generator=g).bfloat16(),
        "i64": torch.randint(-(2**40), 2**40, (9,), generator=g),
        "i32": torch.randint(-1000, 1000, (4, 4), generator=g, dtype=torch.int32),
        "i16": torch.randint(-1000, 1000, (3,), generator=g, dtype=torch.int16),
        "i8": torch.randint(-100, 100, (7,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (11,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(6, generator=g) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }
    if hasattr(torch, "float8_e4m3fn"):
        out["f8"] = torch.randn(16, generator=g).to(torch.float8_e4m3fn)
    return out


def _equal(a, b):
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name].cpu(), b[name].cpu()
        assert x.dtype == y.dtype and x.shape == y.shape, name
        # Compared as bytes: float8 has no torch.equal, and NaN-free equality is not the point.
        assert torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)), name


@pytest.mark.parametrize("device", ["cpu"] + (["cuda:0"] if torch.cuda.is_available() else []))
def test_teraio_files_load_in_safetensors_and_back(tmp_path, device):
    tensors = {k: v.to(device) for k, v in _tensors().items()}
    st.save_file(tensors, tmp_path / "ours.safetensors", metadata={"format": "pt", "by": "teraio"})
    theirs = reference.load_file(str(tmp_path / "ours.safetensors"), device=device)
    _equal(tensors, theirs)
    reference.save_file({k: v.cpu() for k, v in tensors.items()}, str(tmp_path / "theirs.safetensors"),
                        metadata={"format": "pt"})
    ours = st.load_file(tmp_path / "theirs.safetensors", device=device)
    _equal(tensors, ours)
    with st.safe_open(tmp_path / "theirs.safetensors", framework="pt", device=device) as f:
        assert f.metadata() == {"format": "pt"}

