"""Byte-level readers of the containers GPU code objects travel in, and of the tools that list them.

Pure functions over bytes (or an mmap) and text; the I/O and the verdict are in `env_checks.probes.isa`.

* ELF64 section table: where `.hip_fatbin` / `.nv_fatbin` lie in a shared library.
* Clang offload bundles (ROCm/HIP): magic `__CLANG_OFFLOAD_BUNDLE__`, u64 entry count, then per entry u64 offset,
  u64 size, u64 id length and the id, e.g. `hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-` (clang's
  ClangOffloadBundler documentation, "Bundled Binary File Layout" and "Bundle Entry ID").
* Compressed bundles: magic `CCOB`, u16 version, u16 method (LLVM's compression::Format: 0 zlib, 1 zstd), then
  v1: u32 uncompressed size, u64 hash; v2: u32 total size, u32 uncompressed size, u64 hash; v3: the two sizes as
  u64 (clang's documentation, "Compression and Decompression", and `RawCompressedBundleHeader` in LLVM's
  llvm/lib/Object/OffloadBundle.cpp). The payload decompresses to an uncompressed bundle.
* NVIDIA fatbins: no public specification. The layout used here is the reverse-engineered one that two
  independent readers agree on (github.com/jiegec/fatbinary, after n-eiling/cuda-fatbin-decompression; and
  GrigoryEvko/nvopen-tools fatbin/FORMAT_SPECIFICATION.md): a 16-byte header (u32 magic 0xBA55ED50, u16 version 1,
  u16 header size 16, u64 size of what follows), then entries of u16 kind (1 PTX, 2 ELF/cubin), u16, u32 entry
  header size, u64 payload size, ..., u32 arch at byte 28 (90 for sm_90), the next entry at header size + payload
  size; an arch-specific entry (sm_90a) carries the flag ARCH_SPECIFIC_FLAG. Read against cuobjdump 13.4's
  listings of vLLM 0.26.0's and torch 2.11.0's real CUDA libraries (fixtures/recorded/cuda-fatbins): the same
  targets with the same counts. Where a container does not read, cuobjdump is asked (`env_checks.probes.isa`).

And `code_runs_on`: whether code built for one target loads on a device of another.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Any

from env_checks.probes.facts import Unparseable

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
CCOB_MAGIC = b"CCOB"
FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
ZLIB, ZSTD = 0, 1
# A bundle header is 32 bytes plus 24 and an id (~50 bytes) per entry; 128 KiB holds over a thousand entries.
HEADER_PREFIX = 128 * 1024
# zstd blocks are at most 128 KiB, so the first MiB of a compressed payload always decodes past the header.
COMPRESSED_PREFIX = 1024 * 1024
_ANY_BUNDLE = re.compile(re.escape(BUNDLE_MAGIC) + b"|" + CCOB_MAGIC)
# 'hipv4-amdgcn-amd-amdhsa--gfx942' (4-part triple, empty environment); older clang wrote 'hip-amdgcn-amd-amdhsa-gfx906'
_AMD_ENTRY = re.compile(r"^(?:hipv4|hip|openmp)-amdgcn-amd-amdhsa--?(gfx.+)$")
# Generic AMDGPU processors and the processors their code runs on (LLVM AMDGPUUsage, "AMDGPU Generic Processors").
GENERIC_TARGETS = {
    "gfx9-generic": {"gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"},
    "gfx9-4-generic": {"gfx940", "gfx941", "gfx942", "gfx950"},
    "gfx10-1-generic": {"gfx1010", "gfx1011", "gfx1012", "gfx1013"},
    "gfx10-3-generic": {"gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036"},
    "gfx11-generic": {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"},
    "gfx12-generic": {"gfx1200", "gfx1201"},
}


def elf_sections(head: bytes, read: Any) -> dict[str, tuple[int, int]]:
    """Section name -> (file offset, size) of a 64-bit little-endian ELF file.

    `head` is the file's first 64 bytes; `read(offset, size)` returns bytes of the file."""
    if head[:4] != b"\x7fELF":
        raise Unparseable("not an ELF file")
    if head[4:6] != b"\x02\x01":
        raise Unparseable("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    if not shoff or shentsize < 64:
        raise Unparseable("the ELF file has no section table")
    first = read(shoff, 64)
    if shnum == 0:  # extended numbering: the count is in section 0
        shnum, = struct.unpack_from("<Q", first, 0x20)
    if shstrndx == 0xFFFF:
        shstrndx, = struct.unpack_from("<I", first, 0x28)
    if not 0 < shnum <= 65536 or shstrndx >= shnum:
        raise Unparseable(f"implausible section table ({shnum} sections, names in {shstrndx})")
    table = read(shoff, shnum * shentsize)
    if len(table) < shnum * shentsize:
        raise Unparseable("the section table runs past the end of the file")
    rows = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
    _, _, _, _, str_off, str_size = rows[shstrndx]
    names = read(str_off, str_size)
    out = {}
    for name_at, sh_type, _, _, offset, size in rows:
        if sh_type == 8:  # SHT_NOBITS: nothing in the file
            continue
        end = names.find(b"\0", name_at)
        out[names[name_at:end if end >= 0 else None].decode("ascii", "replace")] = (offset, size)
    return out


def bundle_entry_ids(blob: bytes) -> tuple[list[str], int]:
    """Entry ids of the uncompressed offload bundle at blob[0], and the bundle's length (end of its last entry).

    `blob` may be only a prefix of the bundle, as long as it holds the header."""
    if not blob.startswith(BUNDLE_MAGIC):
        raise Unparseable("no offload-bundle magic")
    if len(blob) < 32:
        raise Unparseable("offload bundle header truncated")
    count, = struct.unpack_from("<Q", blob, 24)
    if not 0 < count <= 4096:
        raise Unparseable(f"implausible entry count {count}")
    pos, end, ids = 32, 32, []
    for _ in range(count):
        if pos + 24 > len(blob):
            raise Unparseable("offload bundle header truncated")
        offset, size, id_len = struct.unpack_from("<QQQ", blob, pos)
        pos += 24
        if id_len > 4096 or pos + id_len > len(blob):
            raise Unparseable(f"implausible entry id length {id_len}")
        try:
            ids.append(blob[pos:pos + id_len].decode("ascii"))
        except UnicodeDecodeError:
            raise Unparseable("entry id is not ASCII") from None
        pos += id_len
        end = max(end, offset + size)
    return ids, max(end, pos)


def amd_target(entry_id: str) -> str | None:
    """'hipv4-amdgcn-amd-amdhsa--gfx942:xnack-' -> 'gfx942:xnack-'; None for the host entry and other kinds."""
    m = _AMD_ENTRY.match(entry_id.strip())
    return m.group(1) if m else None


@dataclass(frozen=True)
class CompressedHeader:
    version: int
    method: int
    header_size: int
    total_size: int | None  # v1 does not say where the bundle ends
    uncompressed_size: int


def ccob_header(blob: bytes) -> CompressedHeader:
    if not blob.startswith(CCOB_MAGIC) or len(blob) < 20:
        raise Unparseable("no compressed-bundle header")
    version, method = struct.unpack_from("<HH", blob, 4)
    if version == 1:
        (usize,), total, size = struct.unpack_from("<I", blob, 8), None, 20
    elif version == 2 and len(blob) >= 24:
        (total, usize), size = struct.unpack_from("<II", blob, 8), 24
    elif version == 3 and len(blob) >= 32:
        (total, usize), size = struct.unpack_from("<QQ", blob, 8), 32
    else:
        raise Unparseable(f"unknown compressed-bundle version {version}")
    if method not in (ZLIB, ZSTD):
        raise Unparseable(f"unknown compression method {method}")
    if usize < 32 or (total is not None and total <= size):
        raise Unparseable("implausible compressed-bundle sizes")
    return CompressedHeader(version, method, size, total, usize)


@dataclass
class CompressedBundle:
    offset: int
    end: int
    header: CompressedHeader


@dataclass
class BundleScan:
    """What the offload bundles of one region hold: target -> number of bundles carrying it."""

    targets: dict[str, int] = field(default_factory=dict)
    bundles: int = 0
    compressed: int = 0
    undecoded: list[CompressedBundle] = field(default_factory=list)
    malformed: int = 0

    def add(self, entry_ids: list[str]) -> None:
        for target in sorted({t for t in map(amd_target, entry_ids) if t}):
            self.targets[target] = self.targets.get(target, 0) + 1


def scan_offload_bundles(buf: Any, start: int, end: int, decode: Any) -> BundleScan:
    """Walk the bundles in buf[start:end] (a `.hip_fatbin` section). `decode(method, payload, limit)` gets a
    view of the start of a compressed bundle's payload and returns up to `limit` first bytes of its contents,
    or None when it has no decoder for that method."""
    scan, pos = BundleScan(), start
    with memoryview(buf) as view:
        while (m := _ANY_BUNDLE.search(buf, pos, end)) is not None:
            at = m.start()
            if m.group() == CCOB_MAGIC:
                pos = _compressed_bundle(buf, view, at, end, decode, scan)
                continue
            try:
                ids, length = bundle_entry_ids(bytes(buf[at:min(end, at + HEADER_PREFIX)]))
            except Unparseable:
                scan.malformed += 1
                pos = at + len(BUNDLE_MAGIC)
                continue
            scan.bundles += 1
            scan.add(ids)
            pos = at + length
    return scan


def _compressed_bundle(buf: Any, view: memoryview, at: int, end: int, decode: Any, scan: BundleScan) -> int:
    """Read the CCOB bundle at `at` into scan; the position to search on from."""
    try:
        hdr = ccob_header(bytes(buf[at:at + 32]))
    except Unparseable:
        return at + 4
    if hdr.total_size is not None:
        stop = min(end, at + hdr.total_size)
    else:
        nxt = _ANY_BUNDLE.search(buf, at + hdr.header_size, end)
        stop = nxt.start() if nxt else end
    scan.bundles += 1
    scan.compressed += 1
    payload = at + hdr.header_size
    chunk = view[payload:min(stop, payload + COMPRESSED_PREFIX)]
    try:
        for limit in (8192, HEADER_PREFIX):  # most headers fit the first 8 KiB: decode no more than that first
            prefix = decode(hdr.method, chunk, limit)
            if prefix is None:
                scan.undecoded.append(CompressedBundle(at, stop, hdr))
                break
            try:
                scan.add(bundle_entry_ids(prefix)[0])
                break
            except Unparseable:
                if limit == HEADER_PREFIX or len(prefix) < limit:
                    raise
    except Unparseable:
        scan.malformed += 1
    finally:
        chunk.release()
    return stop if hdr.total_size is not None else payload


@dataclass
class FatbinScan:
    targets: dict[str, int] = field(default_factory=dict)
    containers: int = 0
    malformed: int = 0


# The entry flag of code built for an arch-specific target (sm_90a): read against cuobjdump 13.4 on vLLM 0.26.0's
# CUDA libraries (_C: 24 of its 74 sm_90 cubins, _moe_C 3 of 10, FA3 all 192) and torch 2.11.0's (sm_100a, sm_103a,
# sm_120a, sm_121a): fixtures/recorded/cuda-fatbins, tests/env_checks/test_env_checks_isa.py.
ARCH_SPECIFIC_FLAG = 0x100000


def fatbin_entries(buf: Any, start: int, stop: int) -> list[str]:
    """Targets of the entries of one fatbin container: 'sm_90' for a cubin, 'compute_90' for PTX, with 'a' for
    code built for the arch-specific target ('sm_90a', which loads on sm_90 alone)."""
    out, pos = [], start
    while pos + 64 <= stop:
        kind, _, header_size, size = struct.unpack_from("<HHIQ", buf, pos)
        arch, = struct.unpack_from("<I", buf, pos + 28)
        flags, = struct.unpack_from("<Q", buf, pos + 40)
        if header_size < 64 or pos + header_size + size > stop or not 10 <= arch < 1000:
            raise Unparseable(f"fatbin entry at {pos} is not of the known layout")
        suffix = "a" if flags & ARCH_SPECIFIC_FLAG else ""
        if kind in (2, 0x10):
            out.append(f"sm_{arch}{suffix}")
        elif kind == 1:
            out.append(f"compute_{arch}{suffix}")
        pos += header_size + size
    return out


def scan_fatbins(buf: Any, start: int, end: int) -> FatbinScan:
    """Walk the fatbin containers in buf[start:end] (a `.nv_fatbin` section)."""
    scan, pos = FatbinScan(), start
    while (at := buf.find(FATBIN_MAGIC, pos, end)) >= 0:
        version, header_size, size = struct.unpack_from("<HHQ", buf, at + 4) if at + 16 <= end else (0, 0, 0)
        if version != 1 or header_size != 16 or at + 16 + size > end:
            scan.malformed += 1
            pos = at + 4
            continue
        try:
            targets = fatbin_entries(buf, at + 16, at + 16 + size)
        except Unparseable:
            scan.malformed += 1
        else:
            scan.containers += 1
            for t in sorted(set(targets)):
                scan.targets[t] = scan.targets.get(t, 0) + 1
        pos = at + 16 + size
    return scan


_CUOBJDUMP = re.compile(r"^\s*(ELF|PTX) file\s+\d+:\s*(\S+)\s*$")
_SM = re.compile(r"(?:sm|compute)_(\d+[af]?)")


def parse_cuobjdump_list(text: str) -> dict[str, int]:
    """`cuobjdump --list-elf` / `--list-ptx` lines ('ELF file    1: libx.1.sm_90.cubin') -> target counts."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _CUOBJDUMP.match(line)
        arch = _SM.findall(m.group(2)) if m else None
        if not arch:
            continue
        target = f"{'sm' if m.group(1) == 'ELF' else 'compute'}_{arch[-1]}"
        out[target] = out.get(target, 0) + 1
    return out


def parse_amd_listing(text: str) -> dict[str, int]:
    """`roc-obj-ls` lines ('1  hipv4-amdgcn-amd-amdhsa--gfx942  file://...') or `clang-offload-bundler --list`
    lines (one entry id each) -> target counts."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        for token in line.split():
            target = amd_target(token)
            if target:
                out[target] = out.get(target, 0) + 1
    return out


def code_runs_on(code: str, device: str) -> bool:
    """Whether a code object built for `code` loads on a device whose target is `device`.

    AMD: same processor (or a generic one covering it), and every target feature the code fixes (xnack+,
    sramecc-) set the same way on the device; a device whose setting is unknown is not assumed to match.
    NVIDIA: cubin sm_XY runs on sm_XZ with Z >= Y (sm_XYa only on sm_XY); PTX compute_XY is JIT-compiled for
    any device at or above XY."""
    if device.startswith("sm_"):
        return _nvidia_runs_on(code, device)
    proc, *feats = code.split(":")
    dproc, *dfeats = device.split(":")
    if proc != dproc and dproc not in GENERIC_TARGETS.get(proc, ()):
        return False
    device_features = {f[:-1]: f[-1] for f in dfeats if f[-1:] in "+-"}
    return all(device_features.get(f[:-1]) == f[-1] for f in feats)


def _cc(target: str) -> tuple[int, int, str] | None:
    m = re.fullmatch(r"(?:sm|compute)_(\d+)(\d)([af]?)", target)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def _nvidia_runs_on(code: str, device: str) -> bool:
    c, d = _cc(code), _cc(device)
    if c is None or d is None:
        return False
    if c[2] == "a":
        return c[:2] == d[:2]
    if code.startswith("compute_"):
        return c[:2] <= d[:2]
    return c[0] == d[0] and c[1] <= d[1]
