"""A reader of the MessagePack subset an AMDGPU code object's metadata note is written in.

Code objects v3 and later carry their metadata (`amdhsa.version`, `amdhsa.target`, `amdhsa.kernels`) as one
MessagePack map in an NT_AMDGPU_METADATA note (LLVM AMDGPUUsage, "Code Object V3 Metadata"). This decodes the
types of the MessagePack specification (https://github.com/msgpack/msgpack/blob/master/spec.md) with the standard
library only: nil, booleans, integers, floats, strings, binaries, arrays and maps; an extension value is kept as
its (type, bytes). Anything it cannot read — a truncated value, an unknown first byte, nesting past `MAX_DEPTH` —
raises `Unparseable`, never IndexError or struct.error.
"""

from __future__ import annotations

import struct
from typing import Any

from env_checks.probes.facts import Unparseable

MAX_DEPTH = 64  # the metadata nests maps in arrays in a map: a handful of levels; this bounds a hostile file
_FIXED = {0xC0: None, 0xC2: False, 0xC3: True}
_INTS = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
         0xCA: ">f", 0xCB: ">d"}
_LENGTHS = {0xD9: (">B", "str"), 0xDA: (">H", "str"), 0xDB: (">I", "str"),
            0xC4: (">B", "bin"), 0xC5: (">H", "bin"), 0xC6: (">I", "bin"),
            0xDC: (">H", "array"), 0xDD: (">I", "array"), 0xDE: (">H", "map"), 0xDF: (">I", "map")}
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_EXT = {0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}
# bytes after the first of a value of fixed size: numbers and fixext (its type byte and data)
_SIZES = {b: struct.calcsize(fmt) for b, fmt in _INTS.items()} | {b: 1 + n for b, n in _FIXEXT.items()}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise Unparseable(f"MessagePack value truncated at byte {self.pos} (needs {n}, "
                              f"{len(self.data) - self.pos} left)")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def value(self, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise Unparseable(f"MessagePack nesting deeper than {MAX_DEPTH}")
        b = self.take(1)[0]
        if b <= 0x7F or b >= 0xE0:  # positive / negative fixint
            return b if b <= 0x7F else b - 0x100
        if 0x80 <= b <= 0x8F:
            return self.mapping(b & 0x0F, depth)
        if 0x90 <= b <= 0x9F:
            return [self.value(depth + 1) for _ in range(b & 0x0F)]
        if 0xA0 <= b <= 0xBF:
            return self.text(b & 0x1F)
        if b in _FIXED:
            return _FIXED[b]
        if b in _INTS:
            return self.unpack(_INTS[b])
        if b in _LENGTHS:
            fmt, kind = _LENGTHS[b]
            n = self.unpack(fmt)
            if kind == "str":
                return self.text(n)
            if kind == "bin":
                return self.take(n)
            if kind == "array":
                return [self.value(depth + 1) for _ in range(n)]
            return self.mapping(n, depth)
        if b in _FIXEXT:
            return (self.unpack(">b"), self.take(_FIXEXT[b]))
        if b in _EXT:
            n = self.unpack(_EXT[b])
            return (self.unpack(">b"), self.take(n))
        raise Unparseable(f"MessagePack byte 0x{b:02x} at {self.pos - 1} is no known type")

    def text(self, n: int) -> str:
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise Unparseable(f"MessagePack string before byte {self.pos} is not UTF-8") from None

    def mapping(self, n: int, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for _ in range(n):
            key = self.value(depth + 1)
            try:
                out[key] = self.value(depth + 1)
            except TypeError:  # an unhashable key (an array): no metadata map has one
                raise Unparseable("MessagePack map key is not a scalar") from None
        return out


    def skip(self) -> None:
        """Step over one value without building it (the kernels' metadata is most of a note): a tight loop over
        the bytes, several times faster than decoding them."""
        data, pos, pending, size = self.data, self.pos, 1, len(self.data)
        while pending:
            if pos >= size:
                raise Unparseable(f"MessagePack value truncated at byte {pos}")
            pending -= 1
            b = data[pos]
            pos += 1
            if b <= 0x7F or b >= 0xE0 or b in _FIXED:
                continue
            if b <= 0x9F:
                pending += (b & 0x0F) * (2 if b <= 0x8F else 1)
            elif b <= 0xBF:
                pos += b & 0x1F
            elif b in _SIZES:
                pos += _SIZES[b]
            elif b in _LENGTHS:
                fmt, kind = _LENGTHS[b]
                width = struct.calcsize(fmt)
                if pos + width > size:
                    raise Unparseable(f"MessagePack value truncated at byte {pos}")
                n = int.from_bytes(data[pos:pos + width], "big")
                pos += width
                if kind in ("str", "bin"):
                    pos += n
                else:
                    pending += n * (2 if kind == "map" else 1)
            elif b in _EXT:
                width = struct.calcsize(_EXT[b])
                pos += width + 1 + int.from_bytes(data[pos:pos + width], "big")
            else:
                raise Unparseable(f"MessagePack byte 0x{b:02x} at {pos - 1} is no known type")
        if pos > size:
            raise Unparseable(f"MessagePack value truncated: it ends at byte {pos} of {size}")
        self.pos = pos


def unpack(data: bytes) -> Any:
    """The first MessagePack value in `data` (trailing bytes, such as a note's padding, are ignored)."""
    return _Reader(bytes(data)).value()


def map_entries(data: bytes, keys: set[str]) -> dict[str, Any]:
    """The entries of the MessagePack map at the start of `data` whose keys are in `keys`, decoded; the others are
    stepped over, not built. Raises Unparseable if `data` does not start with a map."""
    reader = _Reader(bytes(data))
    b = reader.take(1)[0]
    if 0x80 <= b <= 0x8F:
        count = b & 0x0F
    elif b in (0xDE, 0xDF):
        count = reader.unpack(">H" if b == 0xDE else ">I")
    else:
        raise Unparseable(f"MessagePack value starts with 0x{b:02x}, not a map")
    out: dict[str, Any] = {}
    for _ in range(count):
        key = reader.value(1)
        if isinstance(key, str) and key in keys:
            out[key] = reader.value(1)
        else:
            reader.skip()
    return out
