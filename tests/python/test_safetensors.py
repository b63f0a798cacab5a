"""teraio.safetensors on the CPU: round trips, the hand-made fixtures, sharded checkpoints,
views and separate allocations, dtype conversion, safe_open, and torch.distributed sharing.

Files are checked with the independent reader of tests/safetensors/reference_check.py, so a
bug shared by TeraIO's writer and loader cannot hide.
"""
import importlib.util
import json
import os
import pathlib
import struct

import pytest
import torch
import torch.distributed
import torch.multiprocessing

import teraio
from teraio import safetensors as st

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE.parent / "safetensors" / "fixtures"

_spec = importlib.util.spec_from_file_location("reference_check", HERE.parent / "safetensors" / "reference_check.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


def raw_bytes(tensor):
    """The little-endian bytes of a tensor's elements in C order."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def storage_ptr(tensor):
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    return storage.data_ptr()


def every_dtype_tensors():
    g = torch.Generator().manual_seed(6)
    tensors = {
        "f64": torch.randn(3, 5, generator=g, dtype=torch.float64),
        "f32": torch.randn(7, generator=g),
        "f16": torch.randn(2, 3, 4, generator=g).half(),
        "bf16": torch.randn(33, generator=g).bfloat16(),
        "c64": torch.randn(3, generator=g, dtype=torch.complex64),
        "i64": torch.randint(-2**40, 2**40, (4,), generator=g),
        "i32": torch.randint(-2**31, 2**31 - 1, (5,), generator=g, dtype=torch.int32),
        "i16": torch.randint(-2**15, 2**15 - 1, (3, 1), generator=g, dtype=torch.int16),
        "i8": torch.randint(-128, 127, (9,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (11,), generator=g, dtype=torch.uint8),
        "bool": torch.rand(6, generator=g) > 0.5,
        "scalar_f32": torch.tensor(3.25),
        "scalar_i16": torch.tensor(-7, dtype=torch.int16),
        "empty_f32": torch.empty(0, 4),
        "empty_bf16": torch.empty(3, 0, dtype=torch.bfloat16),
        "transposed": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
        "odd_u8": torch.arange(3, dtype=torch.uint8),
    }
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):
            tensors[name] = torch.randn(8, generator=g).to(getattr(torch, name))
    return tensors


def assert_same(loaded, expected):
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype, name
        assert loaded[name].shape == tensor.shape, name
        assert raw_bytes(loaded[name]) == raw_bytes(tensor), name


def test_round_trip_of_every_dtype_with_metadata(tmp_path):
    tensors = every_dtype_tensors()
    path = tmp_path / "all.safetensors"
    st.save_file(tensors, path, metadata={"format": "pt", "note": "round trip"})
    on_disk, meta = reference.read(str(path))
    assert meta == {"format": "pt", "note": "round trip"}
    assert {name: on_disk[name] for name in tensors} == {name: raw_bytes(t) for name, t in tensors.items()}
    loaded = st.load_file(path)
    assert_same(loaded, tensors)
    assert all(t.device.type == "cpu" for t in loaded.values())
    assert loaded["scalar_f32"].dim() == 0 and loaded["scalar_f32"].item() == 3.25
    assert loaded["transposed"].is_contiguous() and torch.equal(loaded["transposed"], tensors["transposed"])
    stats = st.last_stats()
    assert stats.bytes == sum(len(b) for b in on_disk.values()) and stats.files == 1
    assert stats.mode in ("direct", "buffered") and stats.backend in ("io_uring", "posix")
    assert stats.seconds > 0 and stats.gigabytes_per_second > 0 and stats.reason


def test_save_bytes_and_load_bytes():
    tensors = {"a": torch.arange(5, dtype=torch.int32), "b": torch.ones(2, 2, dtype=torch.float16)}
    data = st.save(tensors, metadata={"k": "v"})
    assert struct.unpack("<Q", data[:8])[0] % 8 == 0
    assert_same(st.load(data), tensors)


def test_views_share_one_buffer_and_separate_allocations_do_not(tmp_path):
    tensors = {"w": torch.randn(64, 3), "b": torch.randn(5), "n": torch.arange(4)}
    st.save_file(tensors, tmp_path / "m.safetensors")
    views = st.load_file(tmp_path / "m.safetensors")
    assert len({storage_ptr(t) for t in views.values()}) == 1
    separate = st.load_file(tmp_path / "m.safetensors", separate=True)
    assert len({storage_ptr(t) for t in separate.values()}) == 3
    for name, t in separate.items():
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        assert storage.nbytes() == t.numel() * t.element_size(), name
    assert_same(separate, tensors)


def test_dtype_conversion_changes_floating_tensors_only(tmp_path):
    tensors = {"w": torch.randn(16), "h": torch.randn(4).bfloat16(), "ids": torch.arange(6), "m": torch.ones(2) > 0}
    st.save_file(tensors, tmp_path / "m.safetensors")
    loaded = st.load_file(tmp_path / "m.safetensors", dtype=torch.float16)
    assert loaded["w"].dtype == torch.float16 and torch.equal(loaded["w"], tensors["w"].half())
    assert loaded["h"].dtype == torch.float16 and torch.equal(loaded["h"], tensors["h"].half())
    assert loaded["ids"].dtype == torch.int64 and torch.equal(loaded["ids"], tensors["ids"])
    assert loaded["m"].dtype == torch.bool and torch.equal(loaded["m"], tensors["m"])
    with pytest.raises(teraio.Error) as e:
        st.load_file(tmp_path / "m.safetensors", dtype=torch.int32)
    assert e.value.kind == "invalid argument"


@pytest.mark.parametrize("io_mode", ["auto", "buffered", "direct"])
def test_io_modes_read_the_same_bytes(tmp_path, io_mode):
    # Larger than one chunk, with an odd size, so that several reads and a tail are involved.
    tensors = {"big": torch.randn(300_001), "tail": torch.arange(3, dtype=torch.int8)}
    st.save_file(tensors, tmp_path / "m.safetensors")
    if io_mode == "direct":
        try:
            os.close(os.open(tmp_path / "m.safetensors", os.O_RDONLY | os.O_DIRECT))
        except OSError:
            pytest.skip("the temporary directory's file system refuses O_DIRECT")
    loaded = st.load_file(tmp_path / "m.safetensors", io_mode=io_mode, chunk_bytes=64 << 10, chunks_in_flight=3)
    assert_same(loaded, tensors)
    if io_mode != "auto":
        assert st.last_stats().mode == io_mode and st.last_stats().reason == "requested"


def test_bad_arguments_raise_teraio_errors(tmp_path):
    st.save_file({"x": torch.ones(1)}, tmp_path / "m.safetensors")
    cases = [
        (lambda: st.load_file(tmp_path / "m.safetensors", io_mode="fast"), "invalid argument"),
        (lambda: st.load_file(tmp_path / "m.safetensors", io_mode="cufile"), "unsupported"),
        (lambda: st.load_file(tmp_path / "m.safetensors", device="meta"), "invalid argument"),
        (lambda: st.save_file([torch.ones(1)], tmp_path / "x.safetensors"), "invalid argument"),
        (lambda: st.save_file({"x": torch.ones(1)}, tmp_path / "x.safetensors", metadata={"n": 1}),
         "invalid argument"),
        (lambda: st.save_file({"x": torch.ones(1, dtype=torch.complex128)}, tmp_path / "x.safetensors"),
         "unsupported"),
        (lambda: st.save_file({"__metadata__": torch.ones(1)}, tmp_path / "x.safetensors"), "invalid argument"),
        (lambda: st.load_file(tmp_path / "absent.safetensors"), "I/O error"),
    ]
    if not torch.cuda.is_available():
        cases.append((lambda: st.load_file(tmp_path / "m.safetensors", device="cuda:0"), "unsupported"))
    for call, kind in cases:
        with pytest.raises(teraio.Error) as e:
            call()
        assert isinstance(e.value, RuntimeError) and e.value.kind == kind, str(e.value)
    assert not (tmp_path / "x.safetensors").exists()


def test_valid_fixtures_load():
    basic = st.load_file(FIXTURES / "valid_basic.safetensors")
    assert basic["weight"].tolist() == [1.5, -2.0] and basic["bias"].tolist() == [7, 8, 9]
    assert st.load_file(FIXTURES / "valid_empty.safetensors") == {}
    zero = st.load_file(FIXTURES / "valid_zero_sized.safetensors")
    assert zero["empty"].shape == (0, 4) and zero["empty"].dtype == torch.float32
    assert zero["scalar"].dim() == 0 and zero["scalar"].item() == 0x0201
    assert zero["one"].tolist() == [3]
    assert st.load_file(FIXTURES / "valid_unaligned.safetensors")["a"].numpy().tobytes() == b"abcde"
    assert st.load_file(FIXTURES / "valid_null_metadata.safetensors")["x"].tolist() == [5]
    with st.safe_open(FIXTURES / "valid_null_metadata.safetensors", framework="pt") as f:
        assert f.metadata() is None
    with st.safe_open(FIXTURES / "valid_basic.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt", "note": "tiny"}


def test_every_dtype_fixture_loads_what_torch_has_and_names_what_it_lacks():
    path = FIXTURES / "valid_all_dtypes.safetensors"
    expected, _ = reference.read(str(path))
    with st.safe_open(path, framework="pt") as f:
        assert f.keys() == sorted(expected)
        loaded = unsupported = 0
        for name in f.keys():
            try:
                tensor = f.get_tensor(name)
            except teraio.Error as e:
                assert e.kind == "unsupported" and f'"{name}"' in str(e) and name[2:] in str(e)
                unsupported += 1
                continue
            assert tensor.shape == (2, 2) and raw_bytes(tensor) == expected[name], name
            loaded += 1
    # BF16, F16, F32, F64, C64, I8..I64, U8 and BOOL load with every torch; F4 and F6 with none.
    assert loaded >= 11 and unsupported >= 3
    with pytest.raises(teraio.Error) as e:
        st.load_file(path)
    assert e.value.kind == "unsupported" and "t_F4" in str(e.value)


BAD_FIXTURES = sorted(p.name for p in FIXTURES.glob("bad_*.safetensors") if p.name != "bad_utf8.safetensors")


@pytest.mark.parametrize("name", BAD_FIXTURES)
def test_malformed_fixtures_raise_format_errors_naming_the_file(name):
    for load in (st.load_file, st.load, lambda p: st.safe_open(p, framework="pt")):
        with pytest.raises(teraio.Error) as e:
            load(FIXTURES / name)
        assert e.value.kind == "format error" and name in str(e.value)


def test_non_utf8_header_raises_a_format_error():
    with pytest.raises(teraio.Error) as e:
        st.load_file(FIXTURES / "bad_utf8.safetensors")
    assert e.value.kind == "format error"


def test_tensor_not_aligned_to_its_element_size_loads(tmp_path):
    # Not how the reference writer lays files out, but valid: F32 data at offset 1.
    header = json.dumps({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]},
                         "c": {"dtype": "F64", "shape": [0], "data_offsets": [9, 9]}}).encode()
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x07" + struct.pack("<2f", 0.5, -4.0))
    loaded = st.load_file(path)
    assert loaded["a"].tolist() == [7] and loaded["b"].tolist() == [0.5, -4.0] and loaded["c"].shape == (0,)


def test_safe_open_reads_single_tensors(tmp_path):
    tensors = {"z": torch.randn(3, 3), "a": torch.arange(10, dtype=torch.int16), "m": torch.zeros(0)}
    st.save_file(tensors, tmp_path / "m.safetensors", metadata={"format": "pt"})
    with st.safe_open(str(tmp_path / "m.safetensors"), framework="pt", device="cpu") as f:
        assert f.keys() == ["a", "m", "z"]
        assert f.metadata() == {"format": "pt"}
        z = f.get_tensor("z")
        assert torch.equal(z, tensors["z"]) and f.stats.bytes == 36 and st.last_stats() is f.stats
        assert f.get_tensor("m").shape == (0,)
        with pytest.raises(teraio.Error) as e:
            f.get_tensor("nope")
        assert e.value.kind == "invalid argument" and '"nope"' in str(e.value)
    with pytest.raises(teraio.Error):
        st.safe_open(tmp_path / "m.safetensors", framework="np")


def write_sharded(directory, shards):
    """shards: {file name: {tensor name: tensor}}; writes them and their index."""
    weight_map = {}
    for file, tensors in shards.items():
        st.save_file(tensors, directory / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return {name: t for tensors in shards.values() for name, t in tensors.items()}


def sharded_tensors():
    g = torch.Generator().manual_seed(1)
    return {
        "model-00001-of-00003.safetensors": {"embed": torch.randn(10, 4, generator=g),
                                             "layer.0.w": torch.randn(4, 4, generator=g).bfloat16()},
        "model-00002-of-00003.safetensors": {"layer.1.w": torch.randn(4, 4, generator=g).bfloat16(),
                                             "layer.1.ids": torch.arange(3)},
        "model-00003-of-00003.safetensors": {"head": torch.randn(4, 10, generator=g), "empty": torch.zeros(0)},
    }


def test_sharded_checkpoint_loads_as_one_dict(tmp_path):
    expected = write_sharded(tmp_path, sharded_tensors())
    for source in (tmp_path, tmp_path / "model.safetensors.index.json", str(tmp_path)):
        assert_same(st.load(source), expected)
        assert st.last_stats().files == 3
    assert_same(st.load(tmp_path, max_workers=1), expected)  # shards one after another, as in parallel
    single = st.load(tmp_path / "model-00002-of-00003.safetensors")
    assert sorted(single) == ["layer.1.ids", "layer.1.w"]


def test_sharded_checkpoint_takes_the_weight_map_as_authority(tmp_path):
    write_sharded(tmp_path, sharded_tensors())
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    del index["weight_map"]["head"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "head" not in st.load(tmp_path) and "empty" in st.load(tmp_path)

    index["weight_map"]["ghost"] = "model-00001-of-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(teraio.Error) as e:
        st.load(tmp_path)
    assert e.value.kind == "format error" and '"ghost"' in str(e.value)

    del index["weight_map"]["ghost"]
    index["weight_map"]["head"] = "model-00009-of-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(teraio.Error) as e:
        st.load(tmp_path)
    assert e.value.kind == "I/O error" and "model-00009-of-00003.safetensors" in str(e.value)

    index["weight_map"]["head"] = "../elsewhere.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(teraio.Error) as e:
        st.load(tmp_path)
    assert e.value.kind == "format error"


def test_directory_with_a_single_model_file(tmp_path):
    tensors = {"x": torch.arange(4.0)}
    st.save_file(tensors, tmp_path / "model.safetensors")
    assert_same(st.load(tmp_path), tensors)


def _distributed_worker(rank, world, init_file, directory, results):
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        loaded = st.load(directory)
        stats = st.last_stats()
        local = st.load(directory, distributed=False)
        assert sorted(loaded) == sorted(local)
        for name in local:
            assert loaded[name].dtype == local[name].dtype and torch.equal(loaded[name], local[name]), name
        pathlib.Path(results, f"rank{rank}").write_text(json.dumps({"files": stats.files, "bytes": stats.bytes}))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")
def test_distributed_ranks_read_their_share_and_broadcast(tmp_path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    write_sharded(checkpoint, sharded_tensors())
    results = tmp_path / "results"
    results.mkdir()
    torch.multiprocessing.spawn(_distributed_worker, args=(2, str(tmp_path / "init"), str(checkpoint), str(results)),
                                nprocs=2, join=True)
    shard_bytes = [os.path.getsize(checkpoint / name) for name in sorted(sharded_tensors())]
    per_rank = [json.loads((results / f"rank{r}").read_text()) for r in range(2)]
    # Shards 0 and 2 on rank 0, shard 1 on rank 1 (round robin in sorted order).
    assert [r["files"] for r in per_rank] == [2, 1]
    assert per_rank[0]["bytes"] + per_rank[1]["bytes"] < sum(shard_bytes)
    assert per_rank[0]["bytes"] > 0 and per_rank[1]["bytes"] > 0


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@cuda
def test_cuda_round_trip_views_conversion_and_safe_open(tmp_path):
    tensors = every_dtype_tensors()
    on_gpu = {name: t.cuda() for name, t in tensors.items()}
    st.save_file(on_gpu, tmp_path / "gpu.safetensors", metadata={"format": "pt"})
    on_disk, _ = reference.read(str(tmp_path / "gpu.safetensors"))
    assert {name: on_disk[name] for name in tensors} == {name: raw_bytes(t) for name, t in tensors.items()}
    for device in ("cuda", "cuda:0", 0, torch.device("cuda", 0)):
        loaded = st.load_file(tmp_path / "gpu.safetensors", device=device)
        assert all(t.device == torch.device("cuda", 0) for t in loaded.values())
        assert_same({name: t.cpu() for name, t in loaded.items()}, tensors)
    assert st.last_stats().mode in ("cufile", "direct", "buffered")
    separate = st.load_file(tmp_path / "gpu.safetensors", device="cuda:0", separate=True, dtype=torch.float16)
    assert separate["f32"].dtype == torch.float16 and torch.equal(separate["f32"].cpu(), tensors["f32"].half())
    assert separate["i64"].dtype == torch.int64 and torch.equal(separate["i64"].cpu(), tensors["i64"])
    with st.safe_open(tmp_path / "gpu.safetensors", framework="pt", device="cuda:0") as f:
        assert torch.equal(f.get_tensor("bf16").cpu(), tensors["bf16"])
    # A load into memory that kernels on the current stream have just released must not race them.
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            scratch = torch.full((1 << 22,), 7.0, device="cuda")
            scratch.mul_(2).add_(1)
            del scratch
            loaded = st.load_file(tmp_path / "gpu.safetensors", device="cuda:0")
            assert torch.equal(loaded["f64"].cpu(), tensors["f64"])
    for mode in ("direct", "buffered"):
        loaded = st.load(tmp_path / "gpu.safetensors", device="cuda:0", io_mode=mode)
        assert st.last_stats().mode == mode and torch.equal(loaded["c64"].cpu(), tensors["c64"])
