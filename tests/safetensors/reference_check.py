#!/usr/bin/env python3
"""Checks that a safetensors file obeys the format as the reference implementation reads it.

Usage: reference_check.py FILE [FILE...]. Standard library only: an independent reading of
the format (not TeraIO's parser). Where the `safetensors` package is installed (the GPU
machine), each file is also loaded with it and its tensor bytes compared with this reading.
Exit status 0 when every file passes.
"""
import json
import struct
import sys

BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
        "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
        "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n <= 100_000_000 and 8 + n <= len(blob), "header length"
    text = blob[8:8 + n].decode("utf-8")
    assert text.startswith("{"), "header start"
    header = json.loads(text)
    meta = header.pop("__metadata__", None)
    assert meta is None or all(isinstance(v, str) for v in meta.values()), "metadata"
    data = blob[8 + n:]
    start = 0
    tensors = {}
    for name, info in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        begin, end = info["data_offsets"]
        assert begin == start and end >= begin, f"offsets of {name}"
        numel = 1
        for d in info["shape"]:
            assert isinstance(d, int) and d >= 0, f"shape of {name}"
            numel *= d
        bits = numel * BITS[info["dtype"]]
        assert bits % 8 == 0 and bits // 8 == end - begin, f"size of {name}"
        tensors[name] = data[begin:end]
        start = end
    assert start == len(data), "data region not covered exactly"
    return tensors, meta


def main(paths):
    for path in paths:
        tensors, _ = read(path)
        try:
            from safetensors import safe_open  # the reference, where installed
        except ImportError:
            continue
        with safe_open(path, framework="numpy") as f:
            assert sorted(f.keys()) == sorted(tensors), "names differ from the reference"
            for name in f.keys():
                assert f.get_tensor(name).tobytes() == tensors[name], f"bytes of {name} differ"
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
