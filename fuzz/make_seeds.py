#!/usr/bin/python3
"""Writes the binary seeds of fuzz/corpus (npy, checkpoint) by hand from their documented
layouts (docs/kernels.md, include/distca/train/checkpoint.h). The text seeds are plain files
beside them. Run from the repository root: /usr/bin/python3 fuzz/make_seeds.py"""
import os
import struct

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    os.makedirs(os.path.join(root, target), exist_ok=True)
    with open(os.path.join(root, target, name), "wb") as f:
        f.write(data)


def npy(descr, shape, payload, version=1):
    shape_txt = "(" + "".join(f"{s}, " for s in shape).rstrip(" ") + ")" if len(shape) != 1 else f"({shape[0]},)"
    if not shape:
        shape_txt = "()"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_txt}, }}"
    lenfield = 2 if version == 1 else 4
    total = 6 + 2 + lenfield + len(header) + 1
    header += " " * ((64 - total % 64) % 64) + "\n"
    out = b"\x93NUMPY" + bytes([version, 0])
    out += struct.pack("<H" if version == 1 else "<I", len(header)) + header.encode()
    return out + payload


write("fuzz_npy", "f32_2x3.npy", npy("<f4", [2, 3], struct.pack("<6f", 1, 2, 3, 4, 5, 6)))
write("fuzz_npy", "i32_4.npy", npy("<i4", [4], struct.pack("<4i", 0, 3, 7, 12)))
write("fuzz_npy", "f32_scalar.npy", npy("<f4", [], struct.pack("<f", 0.5)))
write("fuzz_npy", "f32_empty_v2.npy", npy("<f4", [0, 4], b"", version=2))
write("fuzz_npy", "f32_1x2x2_v3.npy", npy("<f4", [1, 2, 2], struct.pack("<4f", 1, -1, 2, -2), version=3))


def fnv1a64(b):
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def checkpoint_body(fp, step, seed, adam_step, params):
    n = len(params)
    out = struct.pack("<I", 1) + struct.pack("<Q", len(fp)) + fp.encode()
    out += struct.pack("<qQqq", step, seed, adam_step, n)
    for scale in (1.0, 0.1, 0.01):
        out += struct.pack(f"<{n}f", *[p * scale for p in params])
    return out


for name, body in [
    ("small", checkpoint_body("model=tiny n_layers=2 hidden=128 ranks=2 seed=1 steps=500", 10, 1, 10, [0.5, -1.0, 2.0])),
    ("empty_params", checkpoint_body("model=tiny ranks=1", 0, 7, 0, [])),
]:
    full = b"DCACKPT\n" + body
    full += struct.pack("<Q", fnv1a64(full))
    write("fuzz_checkpoint", name + ".ckpt", full)               # raw mode (first byte even)
    write("fuzz_checkpoint", name + ".wrapped", b"\x01" + body)   # wrapped mode (odd first byte)

# Reproducer (found by review while fixing the first fuzz_checkpoint crash): a parameter count
# of 2^62 whose byte count n * 4 wraps to 0 (tests/fuzz/test_fuzz_regressions.cpp).
body = struct.pack("<I", 1) + struct.pack("<Q", 10) + b"model=tiny" + struct.pack("<qQqq", 3, 0, 0, 1 << 62)
write("fuzz_checkpoint", "crash-param-count-wraps.wrapped", b"\x01" + body)
