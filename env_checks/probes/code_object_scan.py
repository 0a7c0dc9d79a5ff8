"""The raw AMDGPU code objects the installed libraries ship and their caches hold, grouped by library.

A library that loads per-arch code objects at run time (AITER's `hsa/<gfx>/*.co`, Triton's and AITER's AOT
`.hsaco`, kernels compiled into a cache) carries no offload bundle the native-library scan (`isa`) could read: a
missing ISA shows only when the kernel is first loaded, as `hipErrorNoBinaryForGpu`, hours into a run
(vllm-project/vllm#32895). This scan reads every such file's target (`code_objects`) before anything runs.

Where it looks (each found without importing anything):
* packages, shipped with their wheels: aiter (its `aiter_meta/hsa` tree, or `<checkout>/hsa` for an editable
  install, as aiter/jit/core.py resolves AITER_META_DIR), triton, vllm — every `*.co`, `*.hsaco`, and file without a
  suffix that starts as an AMDGPU ELF file; and under aiter the `.so` modules its JIT builds (aiter/jit/core.py
  `get_user_jit_dir`: $AITER_JIT_DIR, else aiter/jit itself, else ~/.aiter/jit), read for their offload bundles;
* caches, filled on some machine and keyed by target, so another GPU's entries are never loaded: Triton's
  ($TRITON_CACHE_DIR, else $TRITON_HOME or ~ + /.triton/cache), AITER's JIT dir outside the package, Inductor's
  ($TORCHINDUCTOR_CACHE_DIR, else <tmp>/torchinductor_<user>), vLLM's ($VLLM_CACHE_ROOT, else
  $XDG_CACHE_HOME or ~/.cache + /vllm).

`installed()` scans once per process and keeps the result: the run header (before any engine starts), the
fingerprint and the device ISA check read the same scan. The verdict on it is `code_object_verdict`.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from env_checks.probes import code_objects, isa
from env_checks.probes.facts import ProbeFailure
from env_checks.probes.isa_formats import GENERIC_TARGETS

PACKAGES: dict[str, tuple[str, ...]] = {"aiter": ("aiter", "aiter_meta"), "triton": ("triton",), "vllm": ("vllm",)}
SUFFIXES = (".co", ".hsaco")
MAX_FILES_PER_ROOT = 200_000   # a cache grown past this is read up to it, and says so
MAX_SENTENCES = 5              # unreadable files named per library; the rest are counted
_PROCESSOR_DIR = re.compile(r"^gfx[0-9a-z]+$")


@dataclass(frozen=True)
class Root:
    library: str      # aiter | triton | vllm | triton cache | aiter jit | inductor cache | vllm cache
    path: str
    kind: str         # package (shipped: loaded as found) | cache (keyed by target: others' entries not loaded)
    jit_modules: bool = False  # `.so` files here are JIT builds, read for their offload bundles


@dataclass
class LibraryCodeObjects:
    """The code objects of one library: target id -> count, and what could not be read."""

    library: str
    kind: str
    roots: list[str] = field(default_factory=list)
    targets: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)       # target -> one code object built for it
    code_objects: int = 0
    # code objects under a folder named for one processor (AITER's hsa/gfx942/) built for another:
    # {"file": label, "folder_for": "gfx942", "built_for": "gfx950"}
    misplaced: list[dict[str, str]] = field(default_factory=list)
    jit_modules: dict[str, list[str]] = field(default_factory=dict)  # JIT module -> the targets it carries
    unreadable: list[str] = field(default_factory=list)          # the first MAX_SENTENCES sentences
    unreadable_count: int = 0
    metadata_disagreements: list[str] = field(default_factory=list)
    truncated: bool = False

    def add(self, label: str, target: str) -> None:
        self.code_objects += 1
        self.targets[target] = self.targets.get(target, 0) + 1
        self.examples.setdefault(target, label)


@dataclass
class CodeObjectScan:
    libraries: list[LibraryCodeObjects] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)   # 'vllm not installed', 'no Triton cache at ...'
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def _package_dirs(name: str, find_spec: Callable = importlib.util.find_spec) -> list[Path]:
    try:
        spec = find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def package_roots(find_spec: Callable = importlib.util.find_spec) -> tuple[list[Root], list[str]]:
    roots, facts = [], []
    for library, modules in PACKAGES.items():
        dirs = [d for m in modules for d in _package_dirs(m, find_spec)]
        if not dirs:
            facts.append(f"{library} not installed")
            continue
        if library == "aiter" and not any(d.name == "aiter_meta" for d in dirs):
            # an editable install: AITER_META_DIR is the checkout, its code objects in <checkout>/hsa
            dirs += [d.parent / "hsa" for d in dirs if (d.parent / "hsa").is_dir()]
        roots += [Root(library, str(d), "package", jit_modules=library == "aiter") for d in dirs]
    return roots, facts


def cache_roots(environ: Mapping[str, str], home: str, tmp: str, user: str) -> list[Root]:
    cache_home = environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return [
        Root("triton cache", environ.get("TRITON_CACHE_DIR", "").strip()
             or os.path.join(environ.get("TRITON_HOME") or home, ".triton", "cache"), "cache"),
        Root("aiter jit", environ.get("AITER_JIT_DIR") or os.path.join(home, ".aiter", "jit"), "cache",
             jit_modules=True),
        Root("inductor cache", environ.get("TORCHINDUCTOR_CACHE_DIR")
             or os.path.join(tmp, "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)), "cache"),
        Root("vllm cache", environ.get("VLLM_CACHE_ROOT") or os.path.join(cache_home, "vllm"), "cache"),
    ]


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's arbitrary user)
        return str(os.getuid())


def installed_roots(environ: Mapping[str, str] | None = None) -> tuple[list[Root], list[str]]:
    """Every root this machine has, and facts about the packages it does not."""
    roots, facts = package_roots()
    env = os.environ if environ is None else environ
    for root in cache_roots(env, str(Path.home()), tempfile.gettempdir(), _user()):
        if any(Path(root.path) == Path(r.path) or Path(r.path) in Path(root.path).parents for r in roots):
            continue  # aiter's JIT dir is aiter/jit itself where the package is writable: scanned with it
        if Path(root.path).is_dir():
            roots.append(root)
        else:
            facts.append(f"no {root.library} ({root.path} does not exist)")
    return roots, facts


def _candidates(root: Root) -> tuple[list[tuple[Path, str]], bool]:
    """(path, how to read it: 'code' | 'peek' | 'module') under root, and whether the walk stopped at the budget."""
    out: list[tuple[Path, str]] = []
    seen = 0
    for folder, dirs, files in os.walk(root.path, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            seen += 1
            if seen > MAX_FILES_PER_ROOT:
                return out, True
            if name.endswith(SUFFIXES):
                out.append((Path(folder, name), "code"))
            elif root.jit_modules and name.endswith(".so"):
                out.append((Path(folder, name), "module"))
            elif "." not in name:
                out.append((Path(folder, name), "peek"))
    return out, False


def _starts_as_amdgpu_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return code_objects.is_amdgpu_elf(f.read(20))
    except OSError:
        return False


def _label(root: Root, path: Path) -> str:
    """How a file is named in sentences: from the package's parent (aiter_meta/hsa/gfx942/x.co) or the cache root."""
    if root.kind == "package":
        return path.relative_to(Path(root.path).parent).as_posix()
    return f"{root.library}: {path.relative_to(root.path).as_posix()}"


def _arch_dir(root: Root, path: Path) -> str | None:
    """The nearest folder named for a processor (AITER's hsa/gfx942/...), which says which GPU loads the file."""
    for part in reversed(path.relative_to(root.path).parts[:-1]):
        if _PROCESSOR_DIR.match(part) and part in code_objects.MACH.values():
            return part
    return None


def _runs_on_processor(target: str, processor: str) -> bool:
    proc = target.split(":")[0]
    return proc == processor or processor in GENERIC_TARGETS.get(proc, ())


def scan_root(root: Root, out: LibraryCodeObjects) -> None:
    """Read every candidate under one root into `out`."""
    home = str(Path.home())
    out.roots.append("~" + root.path[len(home):] if root.path.startswith(home + os.sep) else root.path)
    found, out.truncated = _candidates(root)
    for path, how in found:
        label = _label(root, path)
        if how == "module":
            scanned = isa.scan_hip(str(path), label, tool_dirs=(), timeout_s=30.0)
            if isinstance(scanned, ProbeFailure) or scanned.unknown:
                why = scanned.detail if isinstance(scanned, ProbeFailure) else "; ".join(scanned.notes)
                _unreadable(out, f"{label}: offload bundles unreadable ({why})")
            elif scanned.targets:
                out.jit_modules[label] = sorted(scanned.targets)
            continue
        if how == "peek" and not _starts_as_amdgpu_elf(path):
            continue
        read = code_objects.read_file(path, label)
        if isinstance(read, ProbeFailure):
            _unreadable(out, read.detail)
            continue
        out.add(label, read.target)
        if read.metadata_disagrees:
            out.metadata_disagreements.append(f"{label}: header {read.target}, metadata {read.metadata_target}")
        arch = _arch_dir(root, path)
        if arch and not _runs_on_processor(read.target, arch):
            out.misplaced.append({"file": label, "folder_for": arch, "built_for": read.target})


def _unreadable(out: LibraryCodeObjects, sentence: str) -> None:
    out.unreadable_count += 1
    if len(out.unreadable) < MAX_SENTENCES:
        out.unreadable.append(sentence)


def scan(roots: list[Root], facts: list[str] | None = None) -> CodeObjectScan:
    """Scan `roots`; roots of one library and kind (aiter and aiter_meta) make one record."""
    started = time.monotonic()
    result = CodeObjectScan(facts=list(facts or []))
    by_key: dict[tuple[str, str], LibraryCodeObjects] = {}
    for root in roots:
        key = (root.library, root.kind)
        if key not in by_key:
            by_key[key] = LibraryCodeObjects(root.library, root.kind)
            result.libraries.append(by_key[key])
        scan_root(root, by_key[key])
    result.seconds = round(time.monotonic() - started, 3)
    return result


_MEMO: dict[tuple[Root, ...], CodeObjectScan] = {}
_LOCK = threading.Lock()


def installed(environ: Mapping[str, str] | None = None) -> CodeObjectScan:
    """The scan of this machine's roots, once per process and set of roots (the header, the fingerprint and the
    check share it: what the libraries held when the run started)."""
    roots, facts = installed_roots(environ)
    key = tuple(roots)
    with _LOCK:
        if key not in _MEMO:
            _MEMO[key] = scan(roots, facts)
        return _MEMO[key]


def probe_amdgpu_code_objects() -> CodeObjectScan:
    """The fingerprint's probe (env_checks.record.fingerprint.PROBES)."""
    return installed()


def main(argv: list[str]) -> int:
    """`python -m env_checks.probes.code_object_scan [DIR ...]`: the scan (of DIRs as packages, if given) as JSON."""
    import json

    result = scan([Root(Path(d).name, d, "package", jit_modules=True) for d in argv[1:]]) if argv[1:] else installed()
    print(json.dumps(result.as_dict(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
