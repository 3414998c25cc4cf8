"""An independent Python reading of the C++ snapshot formats (csrc/serialize.h), for tests that
edit snapshots field by field and re-seal them with a valid checksum, so that the loaders'
semantic checks are exercised and not only the checksum.

Evidence store ("RWEVSTOR", format 1), little-endian:
    magic[8] u32 format | f64 gamma_obs | f64 gamma_unobs | u64 count |
    count x (u32 tag, u32 rubric, f64 S, f64 F, i64 version) | u64 fnv1a64(everything before)
Sampler ("RWSAMPLR", format 1):
    magic[8] u32 format | u64 task fingerprint | vec<i32> slot_capability | u64 words |
    vec<u64> evaluated | vec<u64> applicable | vec<i64> attempts | u64 rng[4] |
    u64 len + store snapshot | u64 checksum          (vec<T> = u64 count + count x T)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

STORE_MAGIC = b"RWEVSTOR"
SAMPLER_MAGIC = b"RWSAMPLR"
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


def reseal(data: bytes) -> bytes:
    """`data` with its last 8 bytes replaced by the checksum of the rest (needs >= 8 bytes)."""
    body = bytes(data[:-8])
    return body + struct.pack("<Q", fnv1a64(body))


@dataclass
class StoreSnapshot:
    format: int
    gamma_obs: float
    gamma_unobs: float
    cells: list = field(default_factory=list)  # [tag, rubric, S, F, version]

    @classmethod
    def parse(cls, data: bytes) -> StoreSnapshot:
        assert data[:8] == STORE_MAGIC
        fmt, g_obs, g_unobs, count = struct.unpack_from("<IddQ", data, 8)
        offset = 8 + struct.calcsize("<IddQ")
        cells = []
        for _ in range(count):
            cells.append(list(struct.unpack_from("<IIddq", data, offset)))
            offset += struct.calcsize("<IIddq")
        assert offset == len(data) - 8
        return cls(fmt, g_obs, g_unobs, cells)

    def to_bytes(self, count: int | None = None) -> bytes:
        body = STORE_MAGIC + struct.pack(
            "<IddQ", self.format, self.gamma_obs, self.gamma_unobs, len(self.cells) if count is None else count
        )
        for tag, rubric, s, f, v in self.cells:
            body += struct.pack("<IIddq", tag, rubric, s, f, v)
        return body + struct.pack("<Q", fnv1a64(body))


@dataclass
class SamplerSnapshot:
    format: int
    fingerprint: int
    slot_capability: list
    words: int
    evaluated: list
    applicable: list
    attempts: list
    rng: list
    store: bytes

    @classmethod
    def parse(cls, data: bytes) -> SamplerSnapshot:
        assert data[:8] == SAMPLER_MAGIC
        offset = 8
        (fmt, fingerprint), offset = struct.unpack_from("<IQ", data, offset), offset + 12

        def vector(code: str):
            nonlocal offset
            (count,) = struct.unpack_from("<Q", data, offset)
            offset += 8
            values = list(struct.unpack_from(f"<{count}{code}", data, offset))
            offset += count * struct.calcsize(code)
            return values

        slot_capability = vector("i")
        (words,) = struct.unpack_from("<Q", data, offset)
        offset += 8
        evaluated, applicable, attempts = vector("Q"), vector("Q"), vector("q")
        rng = list(struct.unpack_from("<4Q", data, offset))
        offset += 32
        (size,) = struct.unpack_from("<Q", data, offset)
        offset += 8
        store = bytes(data[offset : offset + size])
        offset += size
        assert offset == len(data) - 8
        return cls(fmt, fingerprint, slot_capability, words, evaluated, applicable, attempts, rng, store)

    def to_bytes(self) -> bytes:
        def vector(code: str, values) -> bytes:
            return struct.pack("<Q", len(values)) + struct.pack(f"<{len(values)}{code}", *values)

        body = (
            SAMPLER_MAGIC
            + struct.pack("<IQ", self.format, self.fingerprint)
            + vector("i", self.slot_capability)
            + struct.pack("<Q", self.words)
            + vector("Q", self.evaluated)
            + vector("Q", self.applicable)
            + vector("q", self.attempts)
            + struct.pack("<4Q", *self.rng)
            + struct.pack("<Q", len(self.store))
            + self.store
        )
        return body + struct.pack("<Q", fnv1a64(body))
