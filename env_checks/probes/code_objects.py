"""A reader of raw AMDGPU code objects: the per-arch ELF files (`.co`, `.hsaco`) that AITER, Triton and others load
at run time with hipModuleLoad, outside any offload bundle.

What a code object is built for is read from two places, as the ROCm loader reads it (LLVM AMDGPUUsage, "ELF
Header" and "Note Records"; https://llvm.org/docs/AMDGPUUsage.html#amdgpu-elf-header):

* the ELF header: e_machine EM_AMDGPU (224); e_ident[EI_OSABI] ELFOSABI_AMDGPU_HSA (64) and e_ident[EI_ABIVERSION]
  (1 = code object v3 ... 4 = v6); e_flags bits 0-7 EF_AMDGPU_MACH (the processor, `MACH` below), v3: bit 8 xnack
  on, bit 9 sramecc on; v4+: bits 8-9 xnack and 10-11 sramecc each 0 unsupported, 1 any, 2 off, 3 on; v6: bits
  24-31 the generic version of a generic processor (gfx9-4-generic ...).
* the NT_AMDGPU_METADATA note (owner "AMDGPU", type 32; v3+): a MessagePack map whose `amdhsa.target` (v4+) is
  the target id, e.g. `amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`.

The target id this reader gives (`CodeObject.target`) is the loader's: the processor, then `sramecc` and `xnack`
where the code fixes them (`+`/`-`), nothing where it runs with either setting ("any"). Pure functions over bytes
and a `read(offset, size)` callable; `read_file` is the one I/O function and never raises: a damaged file is one
sentence in a ProbeFailure.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from env_checks.probes import msgpack_subset
from env_checks.probes.facts import ABSENT, FAILED, UNPARSEABLE, ProbeFailure, Unparseable

EM_AMDGPU = 224
OSABI = {64: "amdhsa", 65: "amdpal", 66: "mesa3d"}
ELFOSABI_AMDGPU_HSA = 64
NT_AMDGPU_METADATA = 32
SHT_NOTE, PT_NOTE = 7, 4
TARGET_KEY = b"\xadamdhsa.target"  # MessagePack fixstr (0xa0 | 13) and the key
MAX_NOTE_BYTES = 16 * 2**20  # a metadata note is kilobytes; more is a damaged header, not something to read

# EF_AMDGPU_MACH -> processor: LLVM AMDGPUUsage's "AMDGPU EF_AMDGPU_MACH Values" (LLVM 20.1), plus the values LLVM
# assigned since (llvm/test/CodeGen/AMDGPU/elf-header-flags-mach.ll on main: gfx1250 0x49, gfx1310 0x50, ...).
# gfx940 (0x40) and gfx941 (0x4b) are gone from LLVM main; code objects built for them still exist.
MACH: dict[int, str] = {
    0x020: "gfx600", 0x021: "gfx601", 0x022: "gfx700", 0x023: "gfx701", 0x024: "gfx702", 0x025: "gfx703",
    0x026: "gfx704", 0x028: "gfx801", 0x029: "gfx802", 0x02A: "gfx803", 0x02B: "gfx810", 0x02C: "gfx900",
    0x02D: "gfx902", 0x02E: "gfx904", 0x02F: "gfx906", 0x030: "gfx908", 0x031: "gfx909", 0x032: "gfx90c",
    0x033: "gfx1010", 0x034: "gfx1011", 0x035: "gfx1012", 0x036: "gfx1030", 0x037: "gfx1031", 0x038: "gfx1032",
    0x039: "gfx1033", 0x03A: "gfx602", 0x03B: "gfx705", 0x03C: "gfx805", 0x03D: "gfx1035", 0x03E: "gfx1034",
    0x03F: "gfx90a", 0x040: "gfx940", 0x041: "gfx1100", 0x042: "gfx1013", 0x043: "gfx1150", 0x044: "gfx1103",
    0x045: "gfx1036", 0x046: "gfx1101", 0x047: "gfx1102", 0x048: "gfx1200", 0x049: "gfx1250", 0x04A: "gfx1151",
    0x04B: "gfx941", 0x04C: "gfx942", 0x04E: "gfx1201", 0x04F: "gfx950", 0x050: "gfx1310", 0x051: "gfx9-generic",
    0x052: "gfx10-1-generic", 0x053: "gfx10-3-generic", 0x054: "gfx11-generic", 0x055: "gfx1152", 0x057: "gfx1154",
    0x058: "gfx1153", 0x059: "gfx12-generic", 0x05A: "gfx1251", 0x05B: "gfx12-5-generic", 0x05C: "gfx1172",
    0x05D: "gfx1170", 0x05E: "gfx1171", 0x05F: "gfx9-4-generic", 0x062: "gfx11-7-generic", 0x063: "gfx13-generic",
}
# Processors with the feature at all (the ROCm loader's MachInfo, ROCR-Runtime amd_hsa_code.cpp): a v3 code object
# without the feature's bit is built with it off on these ('sramecc-'), and says nothing of it elsewhere.
XNACK_PROCESSORS = {"gfx801", "gfx810", "gfx900", "gfx902", "gfx904", "gfx906", "gfx908", "gfx909", "gfx90a",
                    "gfx90c", "gfx940", "gfx941", "gfx942", "gfx950", "gfx1010", "gfx1011", "gfx1012", "gfx1013",
                    "gfx9-generic", "gfx9-4-generic", "gfx10-1-generic"}
SRAMECC_PROCESSORS = {"gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950", "gfx9-4-generic"}
# e_flags v4+: the two bits of each feature
V4_SETTING = {0: "unsupported", 1: "any", 2: "off", 3: "on"}


@dataclass(frozen=True)
class CodeObject:
    """What one AMDGPU code object is built for, as its header and metadata note say."""

    processor: str                 # from e_flags: 'gfx942', 'gfx9-4-generic'
    xnack: str                     # on | off | any | unsupported (v4+); on | off | unsupported (v3)
    sramecc: str
    code_object_version: int       # 3..6 (ELFOSABI_AMDGPU_HSA); 0 where the OS ABI is another
    os_abi: str                    # amdhsa | amdpal | mesa3d | 'osabi N'
    e_flags: int
    generic_version: int = 0       # v6 generic processors: bits 24-31 of e_flags
    metadata_target: str | None = None   # the note's amdhsa.target, verbatim ('amdgcn-amd-amdhsa--gfx942')

    @property
    def target(self) -> str:
        """The target id the loader matches against the device: 'gfx942', 'gfx942:sramecc+:xnack-'."""
        feats = [f"{name}{'+' if setting == 'on' else '-'}"
                 for name, setting in (("sramecc", self.sramecc), ("xnack", self.xnack)) if setting in ("on", "off")]
        return ":".join([self.processor, *feats])

    @property
    def metadata_disagrees(self) -> bool:
        """The note's target id names another target than the header (a hand-edited or mis-linked object)."""
        if not self.metadata_target:
            return False
        return self.metadata_target.rpartition("--")[2] != self.target


def is_amdgpu_elf(head: bytes) -> bool:
    """Whether a file's first 20 bytes are those of a 64-bit little-endian ELF file for EM_AMDGPU."""
    return (len(head) >= 20 and head[:4] == b"\x7fELF" and head[4:6] == b"\x02\x01"
            and struct.unpack_from("<H", head, 18)[0] == EM_AMDGPU)


def _features(processor: str, version: int, flags: int) -> tuple[str, str]:
    """(xnack, sramecc) from e_flags, by the code object version's rule."""
    if version == 3:
        xnack = "on" if flags & 0x100 else "off" if processor in XNACK_PROCESSORS else "unsupported"
        sramecc = "on" if flags & 0x200 else "off" if processor in SRAMECC_PROCESSORS else "unsupported"
        return xnack, sramecc
    return V4_SETTING[(flags >> 8) & 3], V4_SETTING[(flags >> 10) & 3]


def parse_header(head: bytes) -> CodeObject:
    """The header's facts (no metadata) from a file's first 64 bytes."""
    if len(head) < 64:
        raise Unparseable(f"{len(head)} bytes: shorter than an ELF64 header (64 bytes)")
    if head[:4] != b"\x7fELF":
        raise Unparseable("no ELF magic: not a code object")
    if head[4:6] != b"\x02\x01":
        raise Unparseable("not a 64-bit little-endian ELF file, as every AMDGPU code object is")
    machine, = struct.unpack_from("<H", head, 18)
    if machine != EM_AMDGPU:
        raise Unparseable(f"an ELF file for machine {machine}, not EM_AMDGPU ({EM_AMDGPU})")
    osabi, abi_version = head[7], head[8]
    flags, = struct.unpack_from("<I", head, 48)
    version = abi_version + 2 if osabi == ELFOSABI_AMDGPU_HSA else 0
    if osabi == ELFOSABI_AMDGPU_HSA and abi_version == 0:
        raise Unparseable("code object v2 (ELF ABI version 0): its target is in a note this reader does not decode")
    mach = flags & 0xFF
    if mach not in MACH:
        raise Unparseable(f"e_flags 0x{flags:08x} name processor 0x{mach:02x}, which LLVM's EF_AMDGPU_MACH table "
                          "does not list")
    processor = MACH[mach]
    xnack, sramecc = _features(processor, version, flags)
    generic = (flags >> 24) if version >= 6 else 0
    return CodeObject(processor, xnack, sramecc, version, OSABI.get(osabi, f"osabi {osabi}"), flags, generic)


def _note_regions(head: bytes, read: Callable[[int, int], bytes], size: int) -> list[tuple[int, int]]:
    """(offset, size) of the note sections (SHT_NOTE), or of the PT_NOTE segments when there is no section table."""
    phoff, shoff = struct.unpack_from("<QQ", head, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
    regions = []
    for table, entsize, count, type_at, want in ((shoff, shentsize, shnum, 4, SHT_NOTE),
                                                  (phoff, phentsize, phnum, 0, PT_NOTE)):
        if regions or not table or not count:
            continue
        if entsize < (64 if want == SHT_NOTE else 56) or table + entsize * count > size:
            raise Unparseable(f"the ELF header places {count} table entries at byte {table}, past the end of the "
                              f"file ({size} bytes)")
        rows = read(table, entsize * count)
        for i in range(count):
            row = i * entsize
            if struct.unpack_from("<I", rows, row + type_at)[0] != want:
                continue
            if want == SHT_NOTE:
                offset, length = struct.unpack_from("<QQ", rows, row + 24)
            else:
                offset, = struct.unpack_from("<Q", rows, row + 8)
                length, = struct.unpack_from("<Q", rows, row + 32)
            if offset + length > size or length > MAX_NOTE_BYTES:
                raise Unparseable(f"a note of {length} bytes at byte {offset} runs past the end of the file "
                                  f"({size} bytes)")
            regions.append((offset, length))
    return regions


def metadata_notes(blob: bytes) -> list[bytes]:
    """The descriptors of the NT_AMDGPU_METADATA notes ("AMDGPU", type 32) in a note section's bytes."""
    out, pos = [], 0
    while pos + 12 <= len(blob):
        namesz, descsz, kind = struct.unpack_from("<III", blob, pos)
        name_at = pos + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        end = desc_at + (descsz + 3) // 4 * 4
        if desc_at + descsz > len(blob):
            raise Unparseable(f"a note record at byte {pos} of its section runs past the section's end")
        if kind == NT_AMDGPU_METADATA and blob[name_at:name_at + namesz].rstrip(b"\0") == b"AMDGPU":
            out.append(blob[desc_at:desc_at + descsz])
        pos = end
    return out


def parse(head: bytes, read: Callable[[int, int], bytes], size: int) -> CodeObject:
    """A code object's header and metadata; `head` is its first 64 bytes, `read(offset, n)` reads the file."""
    obj = parse_header(head)
    for offset, length in _note_regions(head, read, size):
        for desc in metadata_notes(read(offset, length)):
            # the key, as MessagePack writes a 13-byte string: where it is absent (code objects v3, and hand-written
            # metadata such as most of AITER's) there is nothing to decode, and decoding a note of many kernels'
            # arguments costs a thousand steps
            if TARGET_KEY not in desc:
                continue
            target = msgpack_subset.map_entries(desc, {"amdhsa.target"}).get("amdhsa.target")
            return replace(obj, metadata_target=target if isinstance(target, str) else None)
    return obj


def parse_bytes(data: bytes) -> CodeObject:
    """`parse` over a whole file held in memory."""
    return parse(data[:64], lambda offset, n: data[offset:offset + n], len(data))


def read_file(path: str | Path, label: str | None = None) -> CodeObject | ProbeFailure:
    """The code object at `path`, or one sentence saying why it cannot be read (named by `label`, or the path)."""
    name = label or str(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            head = f.read(64)

            def read(offset: int, n: int) -> bytes:
                f.seek(offset)
                return f.read(n)

            return parse(head, read, size)
    except FileNotFoundError:
        return ProbeFailure(name, ABSENT, f"{name} does not exist")
    except OSError as exc:
        return ProbeFailure(name, FAILED, f"{name} unreadable: {exc.strerror or exc}")
    except Unparseable as exc:
        return ProbeFailure(name, UNPARSEABLE, f"{name} is not a readable AMDGPU code object: {exc}")
    except (struct.error, ValueError, KeyError) as exc:  # a field the checks above did not foresee
        return ProbeFailure(name, UNPARSEABLE, f"{name} is not a readable AMDGPU code object: "
                                               f"{type(exc).__name__}: {exc}")
