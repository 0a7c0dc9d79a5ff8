"""The reader of raw AMDGPU code objects, on real ones: seven `.co`/`.hsaco` files of the amd-aiter
0.1.7.post2.dev18 wheel (fixtures/tools/isa/aiter, SOURCES.md there), laid out as the wheel lays them out. The
target and features are read verbatim from their ELF headers and metadata notes; the feature bits the wheel does not
exercise (every one of its 2613 code objects says xnack any, sramecc any) are set in a copy of a real header; a
truncated or damaged file gives one sentence, never an exception."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from env_checks.probes import code_objects, msgpack_subset
from env_checks.probes.facts import UNPARSEABLE, ProbeFailure, Unparseable

AITER = Path(__file__).resolve().parents[2] / "fixtures" / "tools" / "isa" / "aiter"
AOT = ("aiter/ops/triton/configs/gemm/aot/_gemm_afp4_wfp4_kernel_preshuffled_weight_scales_M=1-N=1280-K=8192/"
       "_gemm_afp4_wfp4_kernel_preshuffled_weight_scales.hsaco")
FLATMM = "aiter_meta/hsa/gfx942/flatmm_uk_gfx9_f16f8_128x256x128_1x4x1_16x16x32.co"
TOPK = "aiter_meta/hsa/gfx942/topksoftmax/topksoftmax_4x128x6.co"

# file -> (processor, code object version, e_flags, the note's amdhsa.target), as llvm-readelf 14.0.6 prints them
REAL = {
    TOPK: ("gfx942", 5, 0x54C, None),
    FLATMM: ("gfx942", 5, 0x54C, "amdgcn-amd-amdhsa--gfx942"),
    "aiter_meta/hsa/gfx942/bf16gemm/bf16gemm_outf32_tn_32x64_pf3.co": ("gfx942", 6, 0x54C, None),
    "aiter_meta/hsa/gfx942/pa_a16w8_f16_2tg_g8_f8.co": ("gfx942", 4, 0x54C, None),
    "aiter_meta/hsa/gfx950/bf16gemm/bf16gemm_outf32_tn_32x64_pf3.co": ("gfx950", 6, 0x54F, None),
    "aiter_meta/hsa/gfx950/fmha_v3_bwd/bwd_hd128_dq_shuffle.co": ("gfx950", 6, 0x54F, None),
    AOT: ("gfx950", 5, 0x54F, "amdgcn-amd-amdhsa--gfx950"),
}


def real(name: str) -> bytes:
    return (AITER / name).read_bytes()


@pytest.mark.parametrize("name", sorted(REAL))
def test_reader_gives_the_target_of_a_real_aiter_code_object(name):
    processor, version, flags, note_target = REAL[name]
    obj = code_objects.read_file(AITER / name)
    assert not isinstance(obj, ProbeFailure), obj
    assert (obj.processor, obj.code_object_version, obj.e_flags, obj.metadata_target) == (processor, version, flags,
                                                                                           note_target)
    # bits 8-11 = 0x500: xnack any, sramecc any, so the target id names the processor alone, as the note does
    assert (obj.xnack, obj.sramecc, obj.os_abi, obj.target) == ("any", "any", "amdhsa", processor)
    assert not obj.metadata_disagrees and obj.generic_version == 0


def with_header(data: bytes, flags: int | None = None, abi_version: int | None = None,
                machine: int | None = None) -> bytes:
    """A copy of a real code object with e_flags, EI_ABIVERSION or e_machine set to another value."""
    out = bytearray(data)
    if flags is not None:
        struct.pack_into("<I", out, 48, flags)
    if abi_version is not None:
        out[8] = abi_version
    if machine is not None:
        struct.pack_into("<H", out, 18, machine)
    return bytes(out)


@pytest.mark.parametrize("bits, target", [
    (0xE00, "gfx942:sramecc+:xnack-"),   # v4+: sramecc on (0xc00), xnack off (0x200): an MI300X's own target id
    (0xB00, "gfx942:sramecc-:xnack+"),   # sramecc off (0x800), xnack on (0x300)
    (0x000, "gfx942"),                   # both unsupported: nothing fixed
])
def test_reader_reads_the_v4_feature_bits_as_the_rocm_loader_does(bits, target):
    obj = code_objects.parse_bytes(with_header(real(TOPK), flags=0x04C | bits))
    assert obj.target == target


def test_reader_reads_the_v3_feature_bits_and_a_generic_processor():
    v3 = with_header(real(TOPK), flags=0x04C, abi_version=1)
    assert code_objects.parse_bytes(v3).target == "gfx942:sramecc-:xnack-"  # v3: a bit not set means off
    assert code_objects.parse_bytes(with_header(v3, flags=0x34C)).target == "gfx942:sramecc+:xnack+"
    generic = code_objects.parse_bytes(with_header(real(TOPK), flags=0x0100_055F, abi_version=4))  # v6
    assert (generic.processor, generic.generic_version, generic.code_object_version) == ("gfx9-4-generic", 1, 6)


def test_the_metadata_target_is_checked_against_the_header():
    """The real note says amdgcn-amd-amdhsa--gfx942; a header made to say sramecc+/xnack- no longer agrees."""
    obj = code_objects.parse_bytes(with_header(real(FLATMM), flags=0xE4C))
    assert obj.target == "gfx942:sramecc+:xnack-" and obj.metadata_disagrees


@pytest.mark.parametrize("cut", [0, 10, 63, 64, 200, 0.5, -1])
def test_a_truncated_code_object_gives_one_sentence(tmp_path, cut):
    data = real(FLATMM)
    end = int(len(data) * cut) if isinstance(cut, float) else cut if cut >= 0 else len(data) - 1
    path = tmp_path / "flatmm.co"
    path.write_bytes(data[:end])
    got = code_objects.read_file(path, "aiter_meta/hsa/gfx942/flatmm.co")
    assert isinstance(got, ProbeFailure) and got.kind == UNPARSEABLE, got
    assert got.detail.startswith("aiter_meta/hsa/gfx942/flatmm.co is not a readable AMDGPU code object: ")
    assert "\n" not in got.detail and len(got.detail) < 300


def test_a_damaged_metadata_note_gives_one_sentence(tmp_path):
    """The target key kept, the MessagePack after it cut: a truncated string, not a crash."""
    data = bytearray(real(FLATMM))
    at = data.index(code_objects.TARGET_KEY) + len(code_objects.TARGET_KEY)
    data[at] = 0xDB  # str32 announcing 4 GB
    path = tmp_path / "damaged.co"
    path.write_bytes(bytes(data))
    got = code_objects.read_file(path)
    assert isinstance(got, ProbeFailure) and "MessagePack value truncated" in got.detail


@pytest.mark.parametrize("machine, why", [(62, "an ELF file for machine 62, not EM_AMDGPU"),
                                          (None, "processor 0x7f, which LLVM's EF_AMDGPU_MACH table does not list")])
def test_an_elf_file_for_another_machine_or_processor_is_named(tmp_path, machine, why):
    data = with_header(real(TOPK), machine=machine, flags=None if machine else 0x57F)
    path = tmp_path / "x.co"
    path.write_bytes(data)
    got = code_objects.read_file(path)
    assert isinstance(got, ProbeFailure) and why in got.detail
    assert code_objects.is_amdgpu_elf(data[:20]) == (machine is None)


def test_a_missing_file_is_a_fact(tmp_path):
    got = code_objects.read_file(tmp_path / "gone.co")
    assert isinstance(got, ProbeFailure) and got.kind == "absent"


def test_msgpack_subset_decodes_a_real_metadata_note_and_steps_over_what_it_skips():
    data = real(AOT)
    obj_head = data[:64]
    regions = code_objects._note_regions(obj_head, lambda o, n: data[o:o + n], len(data))
    (desc,) = [d for o, n in regions for d in code_objects.metadata_notes(data[o:o + n])]
    full = msgpack_subset.unpack(desc)
    assert full["amdhsa.target"] == "amdgcn-amd-amdhsa--gfx950" and full["amdhsa.version"] == [1, 2]
    assert len(full["amdhsa.kernels"]) == 1
    assert msgpack_subset.map_entries(desc, {"amdhsa.version", "amdhsa.target"}) == {
        "amdhsa.version": [1, 2], "amdhsa.target": "amdgcn-amd-amdhsa--gfx950"}


@pytest.mark.parametrize("blob, why", [(b"\xc1", "no known type"), (b"\x92\x01", "truncated"),
                                       (b"\xdd\xff\xff\xff\xff", "truncated"), (b"\x91" * 100, "nesting deeper")])
def test_msgpack_subset_refuses_what_it_cannot_read(blob, why):
    with pytest.raises(Unparseable, match=why):
        msgpack_subset.unpack(blob)
    with pytest.raises(Unparseable):
        msgpack_subset.map_entries(b"\x81\xa1k" + blob, {"x"})
