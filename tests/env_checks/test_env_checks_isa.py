"""The ISA scan of native libraries: real recorded bundle headers and tool listings, and shared libraries built
here byte by byte (an ELF64 file whose `.hip_fatbin` / `.nv_fatbin` section holds bundles or fatbins of the
documented layouts). Negative controls: a library with only gfx90a code where gfx942 is required, only sm_80
cubins on an sm_90 device, unreadable compressed bundles with no decoder installed, a damaged section."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import struct
import threading
import zlib
from pathlib import Path

import pytest

from env_checks.probes import isa
from env_checks.probes import isa_formats as fmt
from env_checks.probes.facts import ABSENT, FAILED, ProbeFailure

MI300X = "gfx942:sramecc+:xnack-"
CODE = b"\x7fELF" + bytes(60)  # stands in for a code object: the readers never look inside


def make_elf(sections: dict[str, bytes]) -> bytes:
    """A 64-bit little-endian ELF shared object holding `sections` (PROGBITS) and its section-name table."""
    items = [*sections.items(), (".shstrtab", b"")]
    names = b"\0" + b"".join(name.encode() + b"\0" for name, _ in items)
    items[-1] = (".shstrtab", names)
    body, rows, name_at = bytearray(64), [(0, 0, 0, 0)], 1
    for name, data in items:
        body += bytes(-len(body) % 16)
        rows.append((name_at, 3 if name == ".shstrtab" else 1, len(body), len(data)))
        body += data
        name_at += len(name) + 1
    body += bytes(-len(body) % 8)
    shoff = len(body)
    for name_off, sh_type, offset, size in rows:
        body += struct.pack("<IIQQQQIIQQ", name_off, sh_type, 0, 0, offset, size, 0, 0, 1, 0)
    body[:16] = b"\x7fELF\x02\x01\x01" + bytes(9)
    struct.pack_into("<HHIQQQIHHHHHH", body, 16, 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(rows), len(rows) - 1)
    return bytes(body)


def make_bundle(targets: list[str]) -> bytes:
    """An uncompressed clang offload bundle: the host entry and one code object per target."""
    ids = [b"host-x86_64-unknown-linux-gnu-"] + [f"hipv4-amdgcn-amd-amdhsa--{t}".encode() for t in targets]
    header_len = 32 + sum(24 + len(i) for i in ids)
    first = header_len + (-header_len % 16)
    head, payload = bytearray(fmt.BUNDLE_MAGIC + struct.pack("<Q", len(ids))), bytearray()
    for i, ident in enumerate(ids):
        size = 0 if i == 0 else len(CODE)
        head += struct.pack("<QQQ", first + len(payload), size, len(ident)) + ident
        payload += b"" if i == 0 else CODE
    return bytes(head) + bytes(first - len(head)) + bytes(payload) + bytes(-len(payload) % 4096)


def raw_zstd_frame(data: bytes) -> bytes:
    """A valid zstd frame (RFC 8878) of raw, uncompressed blocks: single segment, 4-byte content size."""
    out = b"\x28\xb5\x2f\xfd\xa0" + struct.pack("<I", len(data))
    chunks = [data[i:i + 131072] for i in range(0, len(data), 131072)]
    for i, chunk in enumerate(chunks):
        out += ((len(chunk) << 3) | (i == len(chunks) - 1)).to_bytes(3, "little") + chunk
    return out


def make_ccob(inner: bytes, version: int = 3, method: int = fmt.ZLIB) -> bytes:
    comp = zlib.compress(inner) if method == fmt.ZLIB else raw_zstd_frame(inner)
    if version == 1:
        head = struct.pack("<HHIQ", 1, method, len(inner), 0)
    elif version == 2:
        head = struct.pack("<HHIIQ", 2, method, 24 + len(comp), len(inner), 0)
    else:
        head = struct.pack("<HHQQQ", 3, method, 32 + len(comp), len(inner), 0)
    return fmt.CCOB_MAGIC + head + comp + bytes(-(4 + len(head) + len(comp)) % 4096)


def make_fatbin(entries: list[tuple[int, ...]]) -> bytes:
    """A fatbin container of (kind, arch[, flags]) entries: kind 2 = cubin, 1 = PTX."""
    body = b""
    for kind, arch, *flags in entries:
        head = struct.pack("<HHIQIIHHIIIQ", kind, 0x0101, 64, len(CODE), 0, 0, 7, 1, arch, 0, 0,
                           flags[0] if flags else 0x11).ljust(64, b"\0")
        body += head + CODE
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def lib(tmp_path: Path, sections: dict[str, bytes], name: str = "libfake.so") -> str:
    path = tmp_path / name
    path.write_bytes(make_elf(sections))
    return str(path)


def torch_lib(path: str, kind: str = "hip") -> isa.Library:
    return isa.Library("torch", f"torch/lib/{isa.TORCH_LIBS[kind][0]}", path, True)


def vllm_lib(path: str) -> isa.Library:
    return isa.Library("vllm", "vllm/_C.abi3.so", path, True)


@pytest.fixture
def no_tools(no_tools_on_path, monkeypatch):
    monkeypatch.setattr(isa, "ROCM_TOOL_DIRS", ())
    monkeypatch.setattr(isa, "CUDA_TOOL_DIRS", ())


def dumpbin_bytes(text: str) -> bytes:
    words = [w for line in text.splitlines() for w in re.findall(r"\b[0-9A-F]{16}\b", line.split(":", 1)[1])]
    return b"".join(struct.pack("<Q", int(w, 16)) for w in words)


def test_real_bundle_header_from_the_hip_docs(tools_dir):
    blob = dumpbin_bytes((tools_dir / "isa" / "hip_fat_saxpy_gfx906_hip-docs.dumpbin.txt").read_text())
    ids, length = fmt.bundle_entry_ids(blob)
    assert ids == ["host-x86_64-unknown-linux", "hipv4-amdgcn-amd-amdhsa--gfx906"]
    assert length == 0x1000 + 0xD98 and [fmt.amd_target(i) for i in ids] == [None, "gfx906"]


@pytest.mark.parametrize("entry, target", [
    ("hipv4-amdgcn-amd-amdhsa--gfx942", "gfx942"), ("hip-amdgcn-amd-amdhsa-gfx906", "gfx906"),
    ("hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-", "gfx942:sramecc+:xnack-"),
    ("hipv4-amdgcn-amd-amdhsa--gfx9-4-generic", "gfx9-4-generic"), ("host-x86_64-unknown-linux-gnu-", None),
    ("openmp-nvptx64-nvidia-cuda--sm_90", None),
])
def test_bundle_entry_ids_name_targets(entry, target):
    assert fmt.amd_target(entry) == target


def test_recorded_tool_listings(tools_dir):
    text = (tools_dir / "isa" / "roc-obj-ls_saxpy_hip-docs.txt").read_text()
    assert fmt.parse_amd_listing(text) == {"gfx803": 1}
    elf = fmt.parse_cuobjdump_list((tools_dir / "isa" / "cuobjdump_list-elf_pytorch-test.txt").read_text())
    ptx = fmt.parse_cuobjdump_list((tools_dir / "isa" / "cuobjdump_list-ptx_pytorch-test.txt").read_text())
    assert elf == {"sm_61": 1, "sm_52": 1} and ptx == {"compute_61": 1}


def test_uncompressed_bundles_are_read(tmp_path, no_tools):
    path = lib(tmp_path, {".text": b"\x90" * 64, ".hip_fatbin": make_bundle(["gfx90a", "gfx942"]) * 3})
    got = isa.scan_hip(path, "torch/lib/libtorch_hip.so")
    assert (got.targets, got.containers, got.unread) == ({"gfx90a": 3, "gfx942": 3}, 3, 0)
    assert got.source == "offload-bundle scan"
    v = isa.verdict([(torch_lib(path), got)], MI300X, None)
    assert not v.problems and v.sources == {"torch/lib/libtorch_hip.so": "offload-bundle scan"}


def test_library_with_only_gfx90a_is_rejected_on_mi300x(tmp_path, no_tools):
    """The negative control of the ISA check: an MI250X build on an MI300X."""
    path = lib(tmp_path, {".hip_fatbin": make_bundle(["gfx90a"]) + make_bundle(["gfx90a:xnack+"])})
    got = isa.scan_hip(path)
    assert set(got.targets) == {"gfx90a", "gfx90a:xnack+"}
    v = isa.verdict([(vllm_lib(path), got)], MI300X, ["gfx942"])
    assert len(v.problems) == 1
    assert "gfx90a" in v.problems[0] and f"none that runs on {MI300X}" in v.problems[0]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_zlib_compressed_bundles_are_decoded_in_process(tmp_path, no_tools, version):
    section = make_ccob(make_bundle(["gfx942"]), version) + make_ccob(make_bundle(["gfx942", "gfx1100"]), version)
    got = isa.scan_hip(lib(tmp_path, {".hip_fatbin": section}))
    assert got.targets == {"gfx942": 2, "gfx1100": 1} and got.unread == 0
    assert "2 of 2 bundles compressed" in got.notes


def test_zstd_bundles_without_any_decoder_are_unknown_and_fail_closed(tmp_path, no_tools, monkeypatch):
    monkeypatch.setattr(isa, "_inprocess_decoder", lambda method, payload, limit: None)
    path = lib(tmp_path, {".hip_fatbin": make_ccob(make_bundle(["gfx942"]), 3, fmt.ZSTD)})
    got = isa.scan_hip(path)
    assert got.unknown and got.unread == 1
    assert any("neither zstd nor clang-offload-bundler installed" in n for n in got.notes)
    assert "roc-obj-ls not installed" in got.notes
    v = isa.verdict([(vllm_lib(path), got)], MI300X, ["gfx942"])
    assert v.problems and v.problems[0].startswith("could not read the GPU targets of vllm/_C.abi3.so")
    # torch's own arch list stands in for a torch library, and the source says so
    v = isa.verdict([(torch_lib(path), got)], MI300X, ["gfx90a", "gfx942"])
    assert not v.problems and v.sources["torch/lib/libtorch_hip.so"].startswith("torch.cuda.get_arch_list()")
    assert v.figures()["isa_from_arch_list"] == 1
    v = isa.verdict([(torch_lib(path), got)], MI300X, ["gfx90a"])
    assert v.problems and "none that runs on" in v.problems[0]


@pytest.mark.skipif(shutil.which("zstd") is None, reason="the zstd tool is not installed here")
def test_zstd_bundles_through_the_zstd_tool(tmp_path, monkeypatch):
    monkeypatch.setattr(isa, "_inprocess_decoder", lambda method, payload, limit: None)
    got = isa.scan_hip(lib(tmp_path, {".hip_fatbin": make_ccob(make_bundle(["gfx942"]), 2, fmt.ZSTD)}), tool_dirs=())
    assert got.targets == {"gfx942": 1} and got.unread == 0 and got.source == "offload-bundle scan + zstd"


def test_compressed_bundles_through_clang_offload_bundler(tmp_path, no_tools, fake_tool, monkeypatch):
    monkeypatch.setattr(isa, "_inprocess_decoder", lambda method, payload, limit: None)
    fake_tool("clang-offload-bundler", 'printf "host-x86_64-unknown-linux-gnu-\\n'
                                       'hipv4-amdgcn-amd-amdhsa--gfx942\\n"')
    got = isa.scan_hip(lib(tmp_path, {".hip_fatbin": make_ccob(make_bundle(["gfx942"]), 3, fmt.ZSTD)}))
    assert got.targets == {"gfx942": 1} and got.source == "clang-offload-bundler" and not got.unknown


def test_a_failing_bundler_leaves_the_library_unknown(tmp_path, no_tools, fake_tool, monkeypatch):
    monkeypatch.setattr(isa, "_inprocess_decoder", lambda method, payload, limit: None)
    fake_tool("clang-offload-bundler", 'echo "error: Failed to decompress input" >&2; exit 1')
    got = isa.scan_hip(lib(tmp_path, {".hip_fatbin": make_ccob(make_bundle(["gfx942"]), 3, fmt.ZSTD) * 2}))
    assert got.unknown and got.unread == 2
    assert any(n.startswith("0 of 2 compressed bundles tried") and "Failed to decompress" in n for n in got.notes)


def test_unknown_section_content_falls_back_on_roc_obj_ls(tmp_path, no_tools, fake_tool):
    fake_tool("roc-obj-ls", 'echo "1  hipv4-amdgcn-amd-amdhsa--gfx942:xnack-  file://x#offset=4096&size=9"')
    got = isa.scan_hip(lib(tmp_path, {".hip_fatbin": b"\x10\xff\x10\xad" + bytes(60)}))
    assert got.source == "roc-obj-ls" and got.targets == {"gfx942:xnack-": 1}


def test_damaged_and_foreign_files(tmp_path, no_tools):
    truncated = make_bundle(["gfx942"])[:40]
    got = isa.scan_hip(lib(tmp_path, {".hip_fatbin": truncated}))
    assert got.unknown and "1 bundle headers malformed" in got.notes
    text = tmp_path / "notelf.so"
    text.write_text("not a shared library at all, just text" * 4)
    assert isinstance(isa.scan_hip(str(text)), ProbeFailure)
    assert isa.scan_hip(str(tmp_path / "missing.so")).kind == ABSENT


def test_library_without_device_code(tmp_path, no_tools):
    path = lib(tmp_path, {".text": b"\x90" * 32})
    got = isa.scan_hip(path)
    assert not got.targets and not got.unknown and "no .hip_fatbin section" in got.notes[0]
    v = isa.verdict([(torch_lib(path), got)], MI300X, ["gfx942"])
    assert v.problems and "carries no HIP device code" in v.problems[0]
    assert not isa.verdict([(isa.Library("torch", "torch/lib/libc10_hip.so", path, False), got)], MI300X, None).problems


def test_missing_primary_library_fails(tmp_path):
    missing = isa.scan_cuda(str(tmp_path / "libtorch_cuda.so"))
    v = isa.verdict([(torch_lib(str(tmp_path / "libtorch_cuda.so"), "cuda"), missing)], "sm_90", ["sm_90"])
    assert v.problems and "does not exist" in v.problems[0]


def test_fatbins_are_read_when_cuobjdump_is_missing(tmp_path, no_tools):
    section = make_fatbin([(2, 80), (2, 90), (1, 90)]) + make_fatbin([(2, 90)])
    got = isa.scan_cuda(lib(tmp_path, {".nv_fatbin": section}), "torch/lib/libtorch_cuda.so")
    assert got.source == "nv_fatbin scan" and not got.notes
    assert got.targets == {"sm_80": 1, "sm_90": 2, "compute_90": 1} and got.containers == 2
    assert not isa.verdict([(torch_lib("x", "cuda"), got)], "sm_90", None).problems


REAL_FATBINS = Path(__file__).resolve().parents[2] / "fixtures" / "recorded" / "cuda-fatbins"
REAL_LIBRARIES = {"_C_stable_libtorch.abi3.so": "vllm-0.26.0-hopper", "_moe_C_stable_libtorch.abi3.so":
                  "vllm-0.26.0-hopper", "_vllm_fa3_C.abi3.so": "vllm-0.26.0-hopper",
                  "libtorch_cuda.so": "torch-2.11.0", "libtorch_cuda_linalg.so": "torch-2.11.0"}


@pytest.mark.parametrize("library", sorted(REAL_LIBRARIES))
def test_the_fatbin_reader_reads_what_cuobjdump_lists_in_real_libraries(library, tmp_path, no_tools):
    """The CUDA libraries of vLLM 0.26.0 (the wheel the H200 ran) and torch 2.11.0 (PyPI's, the H200's torch):
    every fatbin entry's kind, arch and flags, and cuobjdump 13.4's --list-elf/--list-ptx of the same file. Without
    cuobjdump the in-process reader finds the same targets with the same counts, the arch-specific ones (sm_90a,
    sm_100a, sm_103a, sm_120a, sm_121a) included: arch-specific code read as portable would pass where it cannot
    load (compute_90a PTX does not JIT to a later GPU, compute_90 does)."""
    with gzip.open(REAL_FATBINS / f"{REAL_LIBRARIES[library]}.json.gz", "rt") as f:
        recorded = json.load(f)[library]
    section = b"".join(make_fatbin([tuple(e) for e in entries]) for entries in recorded["containers"])
    got = isa.scan_cuda(lib(tmp_path, {".nv_fatbin": section}), library)
    assert got.source == "nv_fatbin scan" and not got.unread
    assert got.targets == fmt.parse_cuobjdump_list(recorded["cuobjdump_list"])
    if library.startswith("_vllm_fa3"):
        assert set(got.targets) == {"sm_90a"}
        assert not isa.verdict([(vllm_lib(library), got)], "sm_90", None).problems
        flags = recorded["containers"][0][0][2]  # FA3's own entry flags, on a PTX entry of the same arch
        ptx = isa.scan_cuda(lib(tmp_path, {".nv_fatbin": make_fatbin([(1, 90, flags)])}, "ptx.so"))
        assert ptx.targets == {"compute_90a": 1}
        assert isa.verdict([(vllm_lib("ptx.so"), ptx)], "sm_100", None).problems
        assert not isa.verdict([(vllm_lib("ptx.so"), ptx)], "sm_90", None).problems


def test_sm80_only_build_is_rejected_on_sm90_but_ptx_is_enough(tmp_path, no_tools):
    sass_only = isa.scan_cuda(lib(tmp_path, {".nv_fatbin": make_fatbin([(2, 80), (2, 86)])}, "a.so"))
    v = isa.verdict([(vllm_lib("a.so"), sass_only)], "sm_90", None)
    assert v.problems and "sm_80, sm_86" in v.problems[0]
    with_ptx = isa.scan_cuda(lib(tmp_path, {".nv_fatbin": make_fatbin([(2, 80), (1, 80)])}, "b.so"))
    assert not isa.verdict([(vllm_lib("b.so"), with_ptx)], "sm_90", None).problems


def test_damaged_fatbin_is_unknown(tmp_path, no_tools):
    broken = bytearray(make_fatbin([(2, 90)]))
    struct.pack_into("<I", broken, 16 + 4, 4096)  # entry header size past the container
    got = isa.scan_cuda(lib(tmp_path, {".nv_fatbin": bytes(broken)}))
    assert got.unknown


def test_cuobjdump_reads_only_what_the_fatbin_reader_cannot(tmp_path, no_tools, fake_tool):
    fake_tool("cuobjdump", 'case "$1" in --list-elf) echo "ELF file    1: libtorch_cuda.1.sm_90.cubin";; '
                           '*) echo "PTX file    1: libtorch_cuda.1.sm_90.ptx";; esac')
    got = isa.scan_cuda(lib(tmp_path, {".nv_fatbin": make_fatbin([(2, 80)])}))
    assert got.source == "nv_fatbin scan" and got.targets == {"sm_80": 1}  # the reader read it all: no tool run
    broken = bytearray(make_fatbin([(2, 80)]))
    struct.pack_into("<I", broken, 16 + 4, 4096)  # entry header size past the container: the reader cannot
    got = isa.scan_cuda(lib(tmp_path, {".nv_fatbin": bytes(broken)}, "odd.so"))
    assert got.source == "cuobjdump" and got.targets == {"sm_90": 1, "compute_90": 1}
    assert "the fatbin reader left 1 container(s) unread" in got.notes
    not_elf = tmp_path / "not-elf.so"
    not_elf.write_bytes(b"\x7fXYZ" + bytes(124))
    got = isa.scan_cuda(str(not_elf))
    assert got.source == "cuobjdump" and got.targets == {"sm_90": 1, "compute_90": 1}
    assert any(n.startswith("the fatbin reader could not read the file") for n in got.notes)
    got = isa.scan_cuda(lib(tmp_path, {".text": b"x"}, "plain.so"))
    assert got.source == "nv_fatbin scan" and not got.targets and not got.unknown
    fake_tool("cuobjdump", 'echo "cuobjdump fatal: unsupported fatbin version" >&2; exit 1')
    got = isa.scan_cuda(lib(tmp_path, {".nv_fatbin": bytes(broken)}, "new.so"))
    assert got.source == "nv_fatbin scan" and got.unknown  # neither could read it: the verdict fails closed
    assert any("unsupported fatbin version" in n for n in got.notes)
    assert isa.verdict([(vllm_lib("new.so"), got)], "sm_90", None).problems


@pytest.mark.parametrize("code, device, runs", [
    ("gfx942", MI300X, True), ("gfx942:xnack-", MI300X, True), ("gfx942:sramecc+:xnack-", MI300X, True),
    ("gfx942:xnack+", MI300X, False), ("gfx942:xnack-", "gfx942", False), ("gfx9-4-generic", MI300X, True),
    ("gfx90a", MI300X, False), ("gfx9-generic", MI300X, False), ("gfx950", MI300X, False),
    ("sm_90", "sm_90", True), ("sm_90a", "sm_90", True), ("sm_80", "sm_90", False), ("sm_80", "sm_86", True),
    ("sm_86", "sm_80", False), ("compute_80", "sm_90", True), ("compute_90a", "sm_90", True),
    ("compute_100", "sm_90", False), ("sm_90a", "sm_100", False), ("sm_100", "sm_90", False),
    ("sm_120", "sm_120", True), ("gfx942", "sm_90", False),
])
def test_code_runs_on(code, device, runs):
    assert fmt.code_runs_on(code, device) is runs


def test_problems_of_packages_not_under_test_are_advisories(tmp_path, no_tools):
    path = lib(tmp_path, {".hip_fatbin": make_bundle(["gfx90a"])})
    v = isa.verdict([(vllm_lib(path), isa.scan_hip(path))], MI300X, None, strict=("torch",))
    assert not v.problems and v.advisories and v.figures()["isa_advisories"] == 1


def test_find_libraries_without_importing(tmp_path, monkeypatch):
    for rel in ("torch/lib/libtorch_hip.so", "vllm/_C.abi3.so", "vllm/_moe_C.abi3.so",
                "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")

    class Spec:
        def __init__(self, name):
            self.submodule_search_locations = [str(tmp_path / name)]

    monkeypatch.setattr(isa.importlib.util, "find_spec", lambda name: Spec(name))
    libs, facts = isa.find_libraries("hip")
    assert [(x.label, x.primary) for x in libs] == [
        ("torch/lib/libtorch_hip.so", True), ("vllm/_C.abi3.so", True), ("vllm/_moe_C.abi3.so", False),
        ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", False)]
    monkeypatch.setattr(isa.importlib.util, "find_spec", lambda name: None)
    assert isa.find_libraries("cuda") == ([], ["torch not installed", "vllm not installed"])


def test_installed_stack_scans_without_error():
    """On whatever torch/vLLM this interpreter has (CPU builds on the suite's CI): facts, never a crash."""
    for kind in ("hip", "cuda"):
        scans, _ = isa.scan_installed(kind, timeout_s=30)
        for _lib, res in scans:
            assert isinstance(res, (isa.CodeObjects, ProbeFailure))


def test_installed_libraries_are_scanned_side_by_side_in_order(monkeypatch):
    """The scans are tool runs: one after another the H200's eight took 13 s of P0. They run at once (each waits at
    a barrier that only opens when all four are in), and come back in the libraries' order."""
    libs = [isa.Library("vllm", f"vllm/_{i}.so", f"/nowhere/_{i}.so", i == 0) for i in range(4)]
    monkeypatch.setattr(isa, "find_libraries", lambda kind: (libs, ["a fact"]))
    barrier = threading.Barrier(len(libs), timeout=30)

    def scan(path, label, timeout_s):
        barrier.wait()
        return ProbeFailure("scan", FAILED, label)

    monkeypatch.setattr(isa, "scan_cuda", scan)
    scans, facts = isa.scan_installed("cuda", timeout_s=1)
    assert facts == ["a fact"] and [(lib.label, res.detail) for lib, res in scans] == [(x.label,) * 2 for x in libs]
    monkeypatch.setattr(isa, "find_libraries", lambda kind: ([], ["torch not installed"]))
    assert isa.scan_installed("cuda") == ([], ["torch not installed"])
