"""The verdict on a raw code-object scan (`code_object_scan`): which library the device cannot run.

For each library, against the device's target id (`gfx942:sramecc+:xnack-` on an MI300X), with the loader's rule
(`isa_formats.code_runs_on`: the same processor, or a generic one covering it, and every feature the code fixes set
the same way on the device):

* a package none of whose code objects runs on the device fails, naming the library and the ISAs it has: every
  kernel it loads at run time will fail with hipErrorNoBinaryForGpu;
* a package with code for the device and for other ISAs (AITER ships a `hsa/<gfx>/` set per GPU) is a figure and a
  note, not a failure;
* a code object in a folder named for the device's processor (AITER loads `hsa/<gfx of this GPU>/`) but built for
  another, and an AITER JIT module without code for the device, fail: they are loaded on this GPU by name;
* caches are keyed by target, so another GPU's entries there are notes, never failures;
* a package whose code objects could none be read fails closed; some unreadable is a note.

Findings fail the check only for libraries the engine under test loads (`under_test`); the others' are advisories.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from env_checks.probes.code_object_scan import CodeObjectScan, LibraryCodeObjects
from env_checks.probes.isa_formats import code_runs_on

NO_BINARY = "hipErrorNoBinaryForGpu"


@dataclass
class CodeObjectVerdict:
    device: str
    problems: list[str] = field(default_factory=list)     # fail the check
    advisories: list[str] = field(default_factory=list)   # the same findings for libraries not under test
    notes: list[str] = field(default_factory=list)        # per-arch sets, caches, unreadable files
    read: int = 0
    for_device: int = 0
    unreadable: int = 0
    libraries: int = 0
    libraries_mixed: int = 0
    not_applicable: str = ""                               # why the scan does not apply to this target

    def figures(self) -> dict[str, float]:
        if self.not_applicable:
            return {"amdgpu_code_objects_applicable": 0.0}
        return {"amdgpu_code_objects": self.read, "amdgpu_code_objects_for_device": self.for_device,
                "amdgpu_code_objects_for_other_isas": self.read - self.for_device,
                "amdgpu_code_objects_unreadable": self.unreadable,
                "amdgpu_code_object_libraries": self.libraries,
                "amdgpu_code_object_libraries_mixed": self.libraries_mixed,
                "amdgpu_code_object_advisories": len(self.advisories)}


def _counts(targets: dict[str, int]) -> str:
    return ", ".join(f"{t} ({n})" for t, n in sorted(targets.items(), key=lambda kv: (-kv[1], kv[0])))


def judge_library(lib: LibraryCodeObjects, device: str, sink: list[str], v: CodeObjectVerdict) -> None:
    """One library's findings: failures into `sink` (problems or advisories), the rest into v.notes."""
    runnable = {t: n for t, n in lib.targets.items() if code_runs_on(t, device)}
    foreign = {t: n for t, n in lib.targets.items() if t not in runnable}
    v.read += lib.code_objects
    v.for_device += sum(runnable.values())
    v.unreadable += lib.unreadable_count
    v.libraries += bool(lib.code_objects)
    processor = device.split(":")[0]
    if lib.code_objects and not runnable:
        example = lib.examples[max(foreign, key=lambda t: foreign[t])]
        if lib.kind == "package":
            sink.append(f"{lib.library} cannot run on {device}: none of its {lib.code_objects} AMDGPU code objects "
                        f"is for it, they are for {_counts(foreign)} (e.g. {example}); a kernel it loads at run "
                        f"time fails with {NO_BINARY}")
        else:
            v.notes.append(f"{lib.library} holds {lib.code_objects} code objects for {_counts(foreign)}, none for "
                           f"{device}: another GPU's kernels, keyed by target and not loaded here")
    elif foreign:
        v.libraries_mixed += 1
        v.notes.append(f"{lib.library}: {sum(runnable.values())} of {lib.code_objects} code objects run on {device}; "
                       f"{sum(foreign.values())} are for {_counts(foreign)}")
    for m in lib.misplaced:
        sentence = (f"{m['file']} lies under {m['folder_for']}/ but is built for {m['built_for']}: loaded on a "
                    f"{m['folder_for']} GPU it fails with {NO_BINARY}")
        (sink if m["folder_for"] == processor and lib.kind == "package" else v.notes).append(sentence)
    for module, targets in sorted(lib.jit_modules.items()):
        if not any(code_runs_on(t, device) for t in targets):
            (sink if lib.kind == "package" else v.notes).append(
                f"{module} (an AITER JIT build) carries code for {', '.join(targets)} only, not {device}: AITER "
                f"loads a built module by name on any GPU, and its kernels fail with {NO_BINARY}")
    if lib.unreadable_count:
        first = lib.unreadable[0] if lib.unreadable else ""
        if lib.kind == "package" and not lib.code_objects:
            sink.append(f"none of {lib.library}'s {lib.unreadable_count} code object(s) could be read, so whether it "
                        f"runs on {device} is unknown: {first}")
        else:
            v.notes.append(f"{lib.library}: {lib.unreadable_count} file(s) unreadable, e.g. {first}")
    v.notes += [f"{lib.library}: the metadata note disagrees with the header: {d}" for d in lib.metadata_disagreements]
    if lib.truncated:
        v.notes.append(f"{lib.library}: the scan stopped at its file budget; the rest was not read")


def judge(scan: CodeObjectScan, device: str | None, under_test: Iterable[str]) -> CodeObjectVerdict:
    """The scan against the device's target id; libraries named in `under_test` fail, the others advise."""
    v = CodeObjectVerdict(device or "")
    if not device:
        v.problems.append("the device reported no ISA: the raw code objects cannot be judged against it")
        return v
    strict = set(under_test)
    for lib in scan.libraries:
        judge_library(lib, device, v.problems if lib.library in strict else v.advisories, v)
    return v


def summary(scan: CodeObjectScan, devices: Iterable[str], under_test: Iterable[str]) -> list[str]:
    """The run header's sentences: the code objects per library, and each library a device cannot run."""
    found = [f"{lib.library} {lib.code_objects} ({_counts(lib.targets)})" for lib in scan.libraries
             if lib.code_objects]
    lines = [f"AMDGPU code objects: {'; '.join(found) if found else 'none found'} (read in {scan.seconds:.1f} s)"]
    for device in sorted(set(devices)):
        v = judge(scan, device, under_test)
        lines += [f"{p} (the device ISA check fails on it)" for p in v.problems]
    return lines
