"""Which GPU targets the installed torch and vLLM native libraries carry code objects for.

A wheel built without the device's target loads fine and fails at the first kernel launch ('invalid device
function', 'no kernel image is available for execution on the device'); reading the code objects in the `.so`
files predicts that before anything runs. Libraries are found with importlib.util.find_spec, never imported.

ROCm: the offload bundles of `.hip_fatbin` are read in-process (uncompressed ones directly; compressed `CCOB`
ones through zlib, or zstd where this Python has `compression.zstd`), then through the `zstd` tool,
`clang-offload-bundler --list` or `roc-obj-ls` from the ROCm install. CUDA: the `.nv_fatbin` containers are read
in-process (see `isa_formats` for what is verified about that layout), then `cuobjdump --list-elf/--list-ptx` where
the reader leaves a container unread. A missing tool is a fact, never a crash; a library whose targets could not be
read is 'unknown', which the verdict fails closed on, unless torch's own arch list can stand in for a torch library.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from env_checks.probes import isa_formats as fmt
from env_checks.probes.facts import ABSENT, FAILED, ProbeFailure, Unparseable, run_tool

# Decoding compressed bundles one by one through a tool is slow; a sample of this many shows the targets
# (every translation unit of a build is compiled for the same --offload-arch list).
MAX_TOOL_DECODES = 32
ROCM_TOOL_DIRS = ("{ROCM_PATH}/bin", "{ROCM_PATH}/llvm/bin", "/opt/rocm/bin", "/opt/rocm/llvm/bin")
CUDA_TOOL_DIRS = ("{CUDA_HOME}/bin", "{CUDA_PATH}/bin", "/usr/local/cuda/bin")
TOOL_SOURCES = {"cuobjdump", "roc-obj-ls", "clang-offload-bundler", "zstd"}
TORCH_LIBS = {"hip": ("libtorch_hip.so", "libc10_hip.so"),
              "cuda": ("libtorch_cuda.so", "libc10_cuda.so", "libtorch_cuda_linalg.so")}


@dataclass(frozen=True)
class Library:
    package: str     # torch | vllm
    label: str       # e.g. torch/lib/libtorch_hip.so
    path: str
    primary: bool    # must carry device code on a GPU target (libtorch_hip/libtorch_cuda, vllm/_C)


@dataclass
class CodeObjects:
    """The GPU targets one library carries (target -> containers carrying it) and how they were read."""

    library: str
    kind: str                      # hip | cuda
    source: str                    # offload-bundle scan, cuobjdump, nv_fatbin scan, ...
    targets: dict[str, int] = field(default_factory=dict)
    containers: int = 0            # offload bundles or fatbin containers found
    unread: int = 0                # containers whose targets could not be read
    notes: list[str] = field(default_factory=list)

    @property
    def unknown(self) -> bool:
        """Device code is there, but nothing of it could be read."""
        return not self.targets and self.unread > 0


def _tool(name: str, dirs: Iterable[str]) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for template in dirs:
        try:
            base = template.format(**os.environ)
        except KeyError:  # the variable is not set
            continue
        candidate = Path(base) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_libraries(kind: str) -> tuple[list[Library], list[str]]:
    """The torch and vLLM native libraries that can carry `kind` (hip|cuda) device code, and facts about what
    is missing ('vllm not installed')."""
    libs, facts = [], []
    for package in ("torch", "vllm"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError) as exc:
            spec, why = None, f"{package} cannot be located: {exc}"
        else:
            why = f"{package} not installed"
        if spec is None or not spec.submodule_search_locations:
            facts.append(why)
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        if package == "torch":
            for i, name in enumerate(TORCH_LIBS[kind]):
                path = root / "lib" / name
                if path.exists() or i == 0:
                    libs.append(Library("torch", f"torch/lib/{name}", str(path), i == 0))
        else:
            found = sorted({*root.glob("*.so"), *root.glob("*/*.so")})
            if not found:
                facts.append(f"vllm at {root} has no native libraries")
            for path in found:
                rel = path.relative_to(root.parent).as_posix()
                libs.append(Library("vllm", rel, str(path), path.parent == root and path.name.startswith("_C.")))
    return libs, facts


def _inprocess_decoder(method: int, payload: Any, limit: int) -> bytes | None:
    if method == fmt.ZLIB:
        try:
            return zlib.decompressobj().decompress(payload, limit)
        except zlib.error as exc:
            raise Unparseable(f"zlib: {exc}") from None
    try:
        from compression import zstd  # Python >= 3.14
    except ImportError:
        return None
    try:
        return zstd.ZstdDecompressor().decompress(payload, max_length=limit)
    except zstd.ZstdError as exc:
        raise Unparseable(f"zstd: {exc}") from None


def _zstd_cli_prefix(exe: str, blob: bytes, timeout_s: float) -> bytes | None:
    """The first HEADER_PREFIX bytes `zstd -dc` makes of blob; None if it fails."""
    with tempfile.TemporaryFile() as tmp:
        tmp.write(blob)
        tmp.seek(0)
        proc = subprocess.Popen([exe, "-dcq"], stdin=tmp, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        watchdog = threading.Timer(timeout_s, proc.kill)
        watchdog.start()
        try:
            out = proc.stdout.read(fmt.HEADER_PREFIX) if proc.stdout else b""
        finally:
            watchdog.cancel()
            proc.kill()
            proc.wait()
    return out or None


def _bundler_list(exe: str, blob: bytes, timeout_s: float) -> dict[str, int] | ProbeFailure:
    with tempfile.NamedTemporaryFile(suffix=".bundle") as tmp:
        tmp.write(blob)
        tmp.flush()
        out = run_tool([exe, "--list", "--type=o", f"--input={tmp.name}"], timeout_s)
    return out if isinstance(out, ProbeFailure) else fmt.parse_amd_listing(out)


def _sample(items: list, k: int) -> list:
    if len(items) <= k:
        return items
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def _mapped(path: str) -> tuple[mmap.mmap | None, dict[str, tuple[int, int]] | ProbeFailure]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 64:
                return None, ProbeFailure(path, FAILED, f"{path} is too short to be a shared library")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        return None, ProbeFailure(path, ABSENT, f"{path} does not exist")
    except OSError as exc:
        return None, ProbeFailure(path, FAILED, f"{path} unreadable: {exc.strerror or exc}")
    try:
        return mm, fmt.elf_sections(mm[:64], lambda off, n: mm[off:off + n])
    except (Unparseable, struct.error) as exc:
        mm.close()
        return None, ProbeFailure(path, FAILED, f"{path}: {exc}")


def scan_hip(path: str, label: str = "", tool_dirs: Iterable[str] = ROCM_TOOL_DIRS,
             timeout_s: float = 60.0) -> CodeObjects | ProbeFailure:
    """The gfx targets of the offload bundles in a library's `.hip_fatbin` section."""
    mm, sections = _mapped(path)
    if isinstance(sections, ProbeFailure):
        return sections
    out = CodeObjects(label or path, "hip", "offload-bundle scan")
    try:
        if ".hip_fatbin" not in sections:
            out.notes.append("no .hip_fatbin section: no HIP device code")
            return out
        start, size = sections[".hip_fatbin"]
        scan = fmt.scan_offload_bundles(mm, start, start + size, _inprocess_decoder)
        out.targets, out.containers = scan.targets, scan.bundles
        out.unread = len(scan.undecoded) + scan.malformed
        if scan.compressed:
            out.notes.append(f"{scan.compressed} of {scan.bundles} bundles compressed")
        if scan.malformed:
            out.notes.append(f"{scan.malformed} bundle headers malformed")
        if scan.undecoded:
            _decode_with_tools(mm, scan.undecoded, out, list(tool_dirs), timeout_s)
        if not scan.bundles and size:
            out.unread = 1
            out.notes.append(f".hip_fatbin holds {size} bytes but no offload bundle this reader knows")
    finally:
        mm.close()
    if out.unknown:
        _roc_obj_ls(path, out, list(tool_dirs), timeout_s)
    return out


def _decode_with_tools(mm: mmap.mmap, undecoded: list[fmt.CompressedBundle], out: CodeObjects,
                       dirs: list[str], timeout_s: float) -> None:
    zstd_exe = _tool("zstd", dirs)
    bundler = _tool("clang-offload-bundler", dirs)
    if not zstd_exe and not bundler:
        out.notes.append(f"{len(undecoded)} compressed bundles not decoded: no zstd decoder in this Python, and "
                         "neither zstd nor clang-offload-bundler installed")
        return
    tried, decoded, failure = _sample(undecoded, MAX_TOOL_DECODES), 0, ""
    for bundle in tried:
        blob = mm[bundle.offset:bundle.end]
        targets: dict[str, int] | None = None
        if zstd_exe and bundle.header.method == fmt.ZSTD:
            prefix = _zstd_cli_prefix(zstd_exe, blob[bundle.header.header_size:], timeout_s)
            try:
                ids = fmt.bundle_entry_ids(prefix)[0] if prefix else None
            except Unparseable:
                ids = None
            if ids is not None:
                targets, out.source = fmt.parse_amd_listing("\n".join(ids)), "offload-bundle scan + zstd"
        if targets is None and bundler:
            listed = _bundler_list(bundler, blob, timeout_s)
            if isinstance(listed, ProbeFailure):
                failure = f": {listed.detail}"
            else:
                targets, out.source = listed, "clang-offload-bundler"
        if targets is not None:
            decoded += 1
            for t in targets:
                out.targets[t] = out.targets.get(t, 0) + 1
    out.unread -= decoded
    tools = " or ".join(Path(x).name for x in (zstd_exe, bundler) if x)
    sample = f" (a sample of {len(tried)})" if len(tried) < len(undecoded) else ""
    out.notes.append(f"{decoded} of {len(tried)} compressed bundles tried{sample} decoded by {tools}"
                     + (failure if not decoded else ""))


def _roc_obj_ls(path: str, out: CodeObjects, dirs: list[str], timeout_s: float) -> None:
    exe = _tool("roc-obj-ls", dirs)
    if not exe:
        out.notes.append("roc-obj-ls not installed")
        return
    listed = run_tool([exe, path], timeout_s)
    if isinstance(listed, ProbeFailure):
        out.notes.append(listed.detail)
        return
    targets = fmt.parse_amd_listing(listed)
    if targets:
        out.targets, out.source, out.unread = targets, "roc-obj-ls", 0


def scan_cuda(path: str, label: str = "", tool_dirs: Iterable[str] = CUDA_TOOL_DIRS,
              timeout_s: float = 120.0) -> CodeObjects | ProbeFailure:
    """The sm_/compute_ targets of a library's fatbins: the in-process `.nv_fatbin` reader, then cuobjdump where
    the reader left a container unread or could not read the file. The reader lists what cuobjdump 13.4 lists in
    vLLM 0.26.0's and torch 2.11.0's CUDA libraries (fixtures/recorded/cuda-fatbins), in 0.01 s where cuobjdump
    took 7.3 s on libtorch_cuda.so."""
    label = label or path
    if not Path(path).exists():
        return ProbeFailure(path, ABSENT, f"{path} does not exist")
    read = _read_fatbins(path, label)
    if isinstance(read, CodeObjects) and not read.unread:
        return read
    exe = _tool("cuobjdump", tool_dirs)
    if not exe:
        if isinstance(read, CodeObjects):
            read.notes.append("cuobjdump not installed")
        return read
    listed = [run_tool([exe, flag, path], timeout_s) for flag in ("--list-elf", "--list-ptx")]
    why = (f"the fatbin reader left {read.unread} container(s) unread" if isinstance(read, CodeObjects)
           else f"the fatbin reader could not read the file ({read.detail})")
    if all(isinstance(x, str) or "does not contain device code" in x.detail for x in listed):
        targets: dict[str, int] = {}
        for x in listed:
            if isinstance(x, str):
                targets |= fmt.parse_cuobjdump_list(x)
        none = [] if targets else ["cuobjdump: the library does not contain device code"]
        return CodeObjects(label, "cuda", "cuobjdump", targets, sum(targets.values()), notes=[why, *none])
    if isinstance(read, CodeObjects):
        read.notes += [x.detail for x in listed if isinstance(x, ProbeFailure)]
    return read


def _read_fatbins(path: str, label: str) -> CodeObjects | ProbeFailure:
    mm, sections = _mapped(path)
    if isinstance(sections, ProbeFailure):
        return sections
    out = CodeObjects(label, "cuda", "nv_fatbin scan")
    try:
        for name in (".nv_fatbin", "__nv_relfatbin"):
            if name in sections:
                start, size = sections[name]
                scan = fmt.scan_fatbins(mm, start, start + size)
                for t, n in scan.targets.items():
                    out.targets[t] = out.targets.get(t, 0) + n
                out.containers += scan.containers
                out.unread += scan.malformed or (1 if size and not scan.containers else 0)
    finally:
        mm.close()
    if not out.containers and not out.unread:
        out.notes.append("no .nv_fatbin section: no CUDA device code")
    return out


def scan_installed(kind: str, timeout_s: float = 120.0) -> tuple[list[tuple[Library, CodeObjects | ProbeFailure]],
                                                                 list[str]]:
    """Every installed library's scan, in `find_libraries` order. The scans run side by side: a HIP scan is mostly a
    tool run (clang-offload-bundler, roc-obj-ls), and so is a CUDA scan the fatbin reader cannot read (cuobjdump)."""
    from concurrent.futures import ThreadPoolExecutor

    libs, facts = find_libraries(kind)
    scan: Callable[..., CodeObjects | ProbeFailure] = scan_hip if kind == "hip" else scan_cuda
    if not libs:
        return [], facts
    with ThreadPoolExecutor(max_workers=min(len(libs), 8), thread_name_prefix="isa") as pool:
        results = list(pool.map(lambda lib: scan(lib.path, lib.label, timeout_s=timeout_s), libs))
    return list(zip(libs, results)), facts


@dataclass
class IsaVerdict:
    problems: list[str] = field(default_factory=list)      # fail the check
    advisories: list[str] = field(default_factory=list)    # problems of packages not under test
    sources: dict[str, str] = field(default_factory=dict)  # library -> how its targets were read
    notes: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        src = list(self.sources.values())
        return {"isa_libraries_read": len(src),
                "isa_from_scan": sum(s.endswith("scan") for s in src),
                "isa_from_tool": sum(s in TOOL_SOURCES or s.endswith("+ zstd") for s in src),
                "isa_from_arch_list": sum(s.startswith("torch.cuda.get_arch_list") for s in src),
                "isa_advisories": len(self.advisories)}


def verdict(scans: list[tuple[Library, CodeObjects | ProbeFailure]], device: str, arch_list: list[str] | None,
            strict: Iterable[str] = ("torch", "vllm"), other_generation: dict[str, str] | None = None) -> IsaVerdict:
    """Every library with device code carries code that runs on `device`; the primary ones carry device code.
    Unreadable torch libraries fall back on torch's arch list; others fail closed. `other_generation`: libraries
    (label -> why) built for another GPU generation on purpose, whose findings are advisories."""
    v, strict, other = IsaVerdict(), set(strict), dict(other_generation or {})
    for lib, res in scans:
        found: list[str] = []
        sink = v.problems if lib.package in strict and lib.label not in other else v.advisories
        if isinstance(res, ProbeFailure) and res.kind == ABSENT:
            if lib.primary:
                sink.append(f"{lib.label} does not exist: this {lib.package} cannot run kernels on {device}")
            continue
        if isinstance(res, ProbeFailure) or res.unknown:
            why = res.detail if isinstance(res, ProbeFailure) else "; ".join(res.notes) or "unreadable"
            if lib.package == "torch" and arch_list:
                v.sources[lib.label] = f"torch.cuda.get_arch_list() (fallback: {why})"
                found = list(arch_list)
            else:
                sink.append(f"could not read the GPU targets of {lib.label}: {why}")
                continue
        elif not res.targets:
            if lib.primary:
                sink.append(f"{lib.label} carries no {res.kind.upper()} device code ({'; '.join(res.notes)}): "
                            f"this build cannot run kernels on {device}")
            continue
        else:
            v.sources[lib.label], found = res.source, sorted(res.targets)
            v.notes += [f"{lib.label}: {n}" for n in res.notes]
        if not any(fmt.code_runs_on(t, device) for t in found):
            sink.append(f"{lib.label} carries code for {', '.join(found)} (read by {v.sources[lib.label]}) but none "
                        f"that runs on {device}: its kernels will fail with 'invalid device function' / "
                        f"'no kernel image is available'")
    return v


def main(argv: list[str]) -> int:
    """`python -m env_checks.probes.isa [hip|cuda]`: the scan of the installed libraries as JSON."""
    kinds = argv[1:] or ["hip", "cuda"]
    report = {}
    for kind in kinds:
        scans, facts = scan_installed(kind)
        report[kind] = {"facts": facts, "libraries": {
            lib.label: (res.as_dict() if isinstance(res, ProbeFailure) else asdict(res)) for lib, res in scans}}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
