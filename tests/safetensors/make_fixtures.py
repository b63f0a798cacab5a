#!/usr/bin/env python3
"""Writes the hand-made safetensors fixtures of the tests (valid and malformed files).

Standard library only (json + struct), so the files do not depend on the code under test.
Run from anywhere: python3 tests/safetensors/make_fixtures.py
"""
import json
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def raw(name, header_text, data=b"", length=None):
    """header_text: str or bytes, written as is; length overrides the 8-byte header length."""
    body = header_text.encode("utf-8") if isinstance(header_text, str) else header_text
    n = len(body) if length is None else length
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(struct.pack("<Q", n) + body + data)


def padded(header):
    """The reference writer's layout: compact JSON padded with spaces to 8 bytes."""
    text = json.dumps(header, separators=(",", ":"))
    return text + " " * ((8 - len(text) % 8) % 8)


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def main():
    os.makedirs(HERE, exist_ok=True)
    # Valid files.
    raw("valid_basic.safetensors",
        padded({"__metadata__": {"format": "pt", "note": "tiny"},
                "weight": entry("F32", [2], 0, 8), "bias": entry("U8", [3], 8, 11)}),
        struct.pack("<2f", 1.5, -2.0) + bytes([7, 8, 9]))
    dtypes = [("BOOL", 8), ("F4", 4), ("F6_E2M3", 6), ("F6_E3M2", 6), ("U8", 8), ("I8", 8), ("F8_E5M2", 8),
              ("F8_E4M3", 8), ("F8_E8M0", 8), ("F8_E4M3FNUZ", 8), ("F8_E5M2FNUZ", 8), ("I16", 16), ("U16", 16),
              ("F16", 16), ("BF16", 16), ("I32", 32), ("U32", 32), ("F32", 32), ("C64", 64), ("F64", 64),
              ("I64", 64), ("U64", 64)]
    header, offset = {}, 0
    for name, bits in dtypes:
        size = 4 * bits // 8  # four elements: whole bytes even for F4 and F6
        header["t_" + name] = entry(name, [2, 2], offset, offset + size)
        offset += size
    raw("valid_all_dtypes.safetensors", padded(header), bytes(i % 251 for i in range(offset)))
    raw("valid_empty.safetensors", padded({}))
    raw("valid_zero_sized.safetensors",
        padded({"empty": entry("F32", [0, 4], 0, 0), "scalar": entry("I16", [], 0, 2),
                "one": entry("U8", [1], 2, 3)}), b"\x01\x02\x03")
    # Header length 45, not a multiple of 8: the data region starts unaligned.
    text = json.dumps({"a": entry("U8", [5], 0, 5)}, separators=(",", ":"))
    raw("valid_unaligned.safetensors", text, b"abcde")
    raw("valid_null_metadata.safetensors", padded({"__metadata__": None, "x": entry("I8", [1], 0, 1)}), b"\x05")

    # Malformed files: one defect each.
    ok = entry("U8", [2], 0, 2)
    with open(os.path.join(HERE, "bad_too_small.safetensors"), "wb") as f:
        f.write(b"\x01\x00\x00")
    raw("bad_length_past_end.safetensors", '{"x":{}}', length=1000)
    raw("bad_length_limit.safetensors", "{}", length=200_000_000)
    raw("bad_json.safetensors", '{"x": {"dtype": "U8",', b"")
    raw("bad_not_object.safetensors", "[1, 2]   ")
    raw("bad_duplicate.safetensors",
        '{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"x":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}',
        b"abcd")
    raw("bad_duplicate_field.safetensors", '{"x":{"dtype":"U8","dtype":"I8","shape":[2],"data_offsets":[0,2]}}', b"ab")
    raw("bad_dtype.safetensors", padded({"x": entry("F12", [2], 0, 2)}), b"ab")
    raw("bad_missing_dtype.safetensors", padded({"x": {"shape": [2], "data_offsets": [0, 2]}}), b"ab")
    raw("bad_shape_negative.safetensors", padded({"x": entry("U8", [-2], 0, 2)}), b"ab")
    raw("bad_shape_float.safetensors", padded({"x": entry("U8", [2.0], 0, 2)}), b"ab")
    raw("bad_size_mismatch.safetensors", padded({"x": entry("F32", [2], 0, 6)}), b"abcdef")
    raw("bad_overlap.safetensors", padded({"x": ok, "y": entry("U8", [2], 1, 3)}), b"abc")
    raw("bad_hole.safetensors", padded({"x": ok, "y": entry("U8", [2], 3, 5)}), b"abcde")
    raw("bad_reversed.safetensors", padded({"x": entry("U8", [0], 2, 0)}), b"ab")
    raw("bad_truncated.safetensors", padded({"x": entry("U8", [8], 0, 8)}), b"abcd")
    raw("bad_trailing.safetensors", padded({"x": ok}), b"abXX")
    raw("bad_metadata_value.safetensors", padded({"__metadata__": {"n": 1}, "x": ok}), b"ab")
    raw("bad_overflow.safetensors", padded({"x": entry("U8", [2**62, 2**62], 0, 2)}), b"ab")
    raw("bad_packed_odd.safetensors", padded({"x": entry("F4", [3], 0, 2)}), b"ab")
    raw("bad_utf8.safetensors", b'{"x\xff":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"ab")
    raw("bad_offsets_type.safetensors", padded({"x": {"dtype": "U8", "shape": [2], "data_offsets": [0]}}), b"ab")


if __name__ == "__main__":
    main()
