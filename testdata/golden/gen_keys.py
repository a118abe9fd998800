#!/usr/bin/env python3
"""Writes keys.txt: the key set the golden placement files are made from.

ASCII keys, keys with a hash tag, non-ASCII UTF-8, bytes that are not UTF-8,
CR and tab inside keys, a 250-byte key, and empty-ish short keys. One key per
line, split on LF only."""
import random

rng = random.Random(20261130)
keys = [f"key-{i}".encode() for i in range(3000)]
keys += [f"user:{{{i % 97}}}:profile:{i}".encode() for i in range(500)]
keys += [w.encode() for w in ["太阳", "月亮", "星星", "1111号客户端", "ключ", "κλειδί", "🔑", "naïve"]]
keys += [bytes([0x80 + i, 0xff - i, 0x41]) for i in range(64)]
keys += [b"with\rcr", b"with\ttab", b"x" * 250, b"a", b"0", b"{}", b"{", b"}"]
keys += [bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 40))).replace(b"\n", b"") or b"z" for _ in range(400)]
with open("keys.txt", "wb") as f:
    for k in keys:
        assert b"\n" not in k
        f.write(k + b"\n")
