#!/usr/bin/env python3
"""Independent implementation of the v1 block-hash contract (BRIEF section 3).

Writes block_hash_v1.json, the golden vectors that the Rust implementation is
tested against. Needs the `blake3` package from PyPI:

    pip install blake3 && python3 proto/testdata/gen_block_hash_v1.py
"""
import json
import os
import struct

import blake3


def u32le(n):
    return struct.pack("<I", n)


def chain(block_size, model, scope, tokens):
    model_bytes = model.encode("utf-8")
    material = u32le(block_size) + u32le(len(model_bytes)) + model_bytes + u32le(len(scope)) + scope
    key = blake3.blake3(material, derive_key_context="kvroute/block-hash/v1").digest()
    hashes = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = b"".join(u32le(t) for t in tokens[start:start + block_size])
        key = blake3.blake3(block, key=key).digest()
        hashes.append(key[:16].hex())
    return hashes


CASES = [
    ("empty scope, B=16, two blocks", 16, "tiny-random", b"", list(range(32))),
    ("tenant scope, B=16", 16, "tiny-random", b"t:acme", list(range(32))),
    ("tenant scope with salt, B=16", 16, "tiny-random", b"t:acme|s:salt-1", list(range(32))),
    ("B=4, 10 tokens: 2 blocks and 2 tail tokens", 4, "SmolLM2-135M-Instruct", b"", [504, 3575, 282, 4649, 314, 7042, 30, 198, 198, 504]),
    ("B=16, 37 tokens: 2 blocks and 5 tail tokens", 16, "SmolLM2-135M-Instruct", b"", [(i * 7919) % 49152 for i in range(37)]),
    ("token ids above 65535, B=16", 16, "tiny-random", b"", [65535 + i * 1000 for i in range(16)] + [4294967295] * 16),
    ("fewer tokens than a block", 16, "tiny-random", b"", [1, 2, 3]),
    ("no tokens", 16, "tiny-random", b"", []),
    ("B=4, UTF-8 model id and tenant", 4, "modèle/ünïcode", "t:tenant-é".encode("utf-8"), list(range(100, 117))),
    ("B=32, 64 tokens", 32, "m", b"", list(range(64))),
]


def main():
    vectors = []
    for name, block_size, model, scope, tokens in CASES:
        vectors.append({
            "name": name,
            "block_size": block_size,
            "model": model,
            "scope_hex": scope.hex(),
            "tokens": tokens,
            "hashes": chain(block_size, model, scope, tokens),
        })
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "block_hash_v1.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"contract": "kvroute/block-hash/v1", "vectors": vectors}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
