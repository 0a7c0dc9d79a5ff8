"""`conformance diagnose FILE|- [FILE|- ...]`: read pasted tool outputs or logs, say what each is, the facts it
states and the known fault signatures it shows, with their remedies, in one screen (or as JSON for tools). Several
files of one machine are merged and cross-checked (`env_checks.crosscheck`): their contradictions are reported.

Exit codes: 0 no known fault signature, 1 fault signature(s) found, 2 unreadable input or bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from env_checks import crosscheck
from env_checks.pasted.registry import FAMILIES
from env_checks.signatures import Match, default_signatures, match

# The input is read whole, in windows of this many bytes cut at line ends (memory stays bounded): the tool readers and
# their facts see the first window, every signature is searched in every window (a kernel log's newest lines,
# at its end, are its most important).
MAX_BYTES = 4 * 1024 * 1024

LIST_FACTS = ("gpu_models", "gfx_targets", "device_ids", "cpu_models", "compute_units")


@dataclass
class Report:
    kinds: list[str]
    facts: dict[str, Any]
    unread: list[str]
    matches: list[Match] = field(default_factory=list)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    contradictions: list[crosscheck.Contradiction] = field(default_factory=list)

    @property
    def faults(self) -> list[Match]:
        return [m for m in self.matches if m.severity == "fault"]

    @property
    def exit_code(self) -> int:
        if not self.kinds and not self.matches:
            return 2
        if self.faults:
            return 1
        return 3 if self.contradictions else 0  # the inputs disagree: worth a look even with no known fault

    def as_dict(self) -> dict[str, Any]:
        """The `diagnose --json` object; its schema is documented in docs/diagnose.md (and checked in the tests)."""
        inputs = self.inputs or [{"input": "", "kinds": self.kinds, "facts": self.facts, "unread": self.unread,
                                  "signature_ids": [m.id for m in self.matches]}]
        return {"kinds": self.kinds, "facts": self.facts, "unread": self.unread,
                "signatures": [m.as_dict() for m in self.matches],
                "contradictions": [c.as_dict() for c in self.contradictions], "inputs": inputs,
                "exit_code": self.exit_code}


def _merge(into: dict[str, Any], facts: dict[str, Any]) -> None:
    for key, value in facts.items():
        if key in LIST_FACTS and isinstance(value, list):
            into.setdefault(key, [])
            into[key] += [v for v in value if v not in into[key]]
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            for sub, subvalue in value.items():
                into[key].setdefault(sub, subvalue)
        else:
            into.setdefault(key, value)


def diagnose_text(text: str) -> Report:
    """What `text` is, the facts it states, what could not be read, and the signatures it matches."""
    kinds, facts, unread = [], {}, []
    if "\ufffd" in text or "\x00" in text:
        unread.append("The text contains bytes that are not UTF-8 text (binary noise or a damaged copy); lines "
                      "with them may be misread or skipped.")
    text = text.replace("\r\n", "\n").replace("\x00", "")
    for family, detect, read in FAMILIES:  # every family whose detector fires contributes its reader's facts
        try:
            if not detect(text):
                continue
            reading = read(text)
        except Exception as exc:  # noqa: BLE001 - a reader bug must become a sentence, never a traceback
            unread.append(f"The {family} reader could not read this text ({type(exc).__name__}: {exc}).")
            continue
        if reading.facts or family in ("kernel log", "error trace", "vLLM log") or not kinds:
            kinds.append(reading.kind)
            _merge(facts, reading.facts)
            unread += [s for s in reading.unread if s not in unread]
    if "gpu_count" in facts:
        facts.pop("gpu_count_at_least", None)
        facts.pop("gpus_listed", None)
    if not kinds:
        unread.append(f"This text is not an output of a tool diagnose knows ({KNOWN}).")
    report = Report(kinds, facts, unread, match(text))
    report.contradictions = crosscheck.firmware([("", kinds, facts)])
    return report


# The families diagnose reads, named as people know them (the refusal sentence and --help list them).
KNOWN = ("rocminfo (whole or part of an agent block), amd-smi (default view, static, metric, monitor, list, "
         "topology, xgmi, partition, firmware, bad-pages, process, version; text, --csv, --json or a jq fragment), "
         "rocm-smi, nvidia-smi, collect_env (PyTorch's and vLLM's, CUDA 12/13 and ROCm; whole, cut or a tail), "
         "hipconfig, modinfo amdgpu, amdgpu_firmware_info, KFD topology mem_banks properties, "
         "update-alternatives --display rocm, a kernel log, "
         "a HIP runtime log (AMD_LOG_LEVEL, hipErrorNoBinaryForGpu), a vLLM log or an error trace")


def _fact_text(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def render(report: Report, source: str) -> str:
    out = [f"{source}: {', '.join(report.kinds) if report.kinds else 'not recognised'}"]
    for item in report.inputs if len(report.inputs) > 1 else []:
        out.append(f"  {item['input']}: {', '.join(item['kinds']) if item['kinds'] else 'not recognised'}")
    shown = {k: v for k, v in report.facts.items() if k != "firmware_by_gpu"}
    if shown:
        out.append("Facts:" if len(report.inputs) < 2 else "Facts (merged; the first input stating one wins):")
        width = max((len(k) for k in shown), default=0)
        out += [f"  {key.ljust(width)}  {_fact_text(value)}" for key, value in shown.items()]
    if report.contradictions:
        out.append(f"Contradictions ({len(report.contradictions)}):")
        out += [f"  [{c.check}] {c.sentence}" for c in report.contradictions]
    for sentence in report.unread:
        out.append(f"Could not read: {sentence}")
    if report.matches:
        out.append(f"Known signatures ({len(report.faults)} fault(s)):")
        for m in report.matches:
            where = f"line {m.lineno}" + (f", {m.count}x" if m.count > 1 else "")
            out.append(f"  [{m.severity}] {m.id} - {m.title} ({where}): {m.line[:140]}")
            out.append(f"      cause:  {m.cause}")
            out.append(f"      remedy: {m.remedy}")
            if m.link:
                out.append(f"      see:    {m.link}")
    else:
        out.append("Known signatures: none matched.")
    return "\n".join(out)


def build_parser(prog: str = "conformance diagnose") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Read a pasted tool output or log and print what it is, the facts it states (GPU model, "
                    "gfx target, GPU count, driver/firmware/ROCm/CUDA versions, partition mode, VF or bare "
                    "metal, ECC counts) and the known fault signatures it matches, each with its cause, remedy "
                    "and a link. Truncated or damaged input still gives what can be read, and says what could "
                    "not.",
        epilog="Reads: rocminfo (whole, or part of an agent block); amd-smi (default view, static, metric, "
               "monitor, list, topology, xgmi, partition, firmware, bad-pages, process, version; text, --csv or "
               "--json, and `--json | jq` fragments); rocm-smi (text, --showvoltage, --csv, --json); nvidia-smi "
               "(table, -q, -q -x, --query-gpu --format=csv); python -m torch.utils.collect_env / vLLM collect_env "
               "(CUDA 12/13, ROCm); hipconfig; modinfo amdgpu; /sys/kernel/debug/dri/N/amdgpu_firmware_info; "
               "/sys/class/kfd/kfd/topology/nodes/N/mem_banks/M/properties; update-alternatives --display rocm; "
               "dmesg / journalctl -k (page faults, RAS/ACA, probe and IP discovery failures); a HIP runtime log "
               "(AMD_LOG_LEVEL, hipErrorNoBinaryForGpu); a HIP/CUDA error trace; a vLLM server log.\n"
               "Several files of one machine (a.txt b.txt -) are merged and cross-checked: firmware the same on "
               "every GPU, rocminfo's gfx target against the amd-smi/rocm-smi model, modinfo's driver version "
               "against amd-smi's; disagreements are listed as contradictions.\n"
               "Exit codes: 0 no known fault signature, 1 fault signature(s) found, 2 unreadable input or "
               "bad usage, 3 no fault signature but contradiction(s) between the facts read.\n"
               "Example: rocm-smi | conformance diagnose -   or   conformance diagnose --json dmesg.txt")
    parser.add_argument("file", nargs="+", help="the file(s) to read, - for standard input (once)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (kinds, facts, unread, "
                                                            "signatures, contradictions, inputs, exit_code) "
                                                            "instead of text")
    return parser


def _windows(handle: Any, size: int = 0) -> Any:
    """(text, lines before it) of consecutive windows of about `size` bytes, each cut after a line end."""
    size = size or MAX_BYTES
    carry, lines_before = b"", 0
    while True:
        block = handle.read(size)
        data = carry + block
        if not block:
            if data:
                yield data.decode("utf-8", errors="replace"), lines_before
            return
        cut = data.rfind(b"\n") + 1 if len(data) >= size else 0
        if cut <= 0:
            carry = data
            continue
        window, carry = data[:cut], data[cut:]
        yield window.decode("utf-8", errors="replace"), lines_before
        lines_before += window.count(b"\n")


def _merge_matches(into: dict[str, Match], found: list[Match], lines_before: int) -> None:
    for m in found:
        if m.id in into:
            into[m.id] = replace(into[m.id], count=into[m.id].count + m.count)
        else:
            into[m.id] = replace(m, lineno=m.lineno + lines_before)


def diagnose_stream(handle: Any, window_bytes: int = 0) -> tuple[Report | None, int]:
    """The report of a whole input read window by window (None when it is empty), and the bytes read."""
    report, matches, read, windows = None, {}, 0, 0
    for text, lines_before in _windows(handle, window_bytes):
        read += len(text.encode("utf-8", errors="replace"))
        windows += 1
        if report is None:
            if not text.strip():
                continue
            report = diagnose_text(text)
            _merge_matches(matches, report.matches, 0)
        else:
            _merge_matches(matches, match(text.replace("\r\n", "\n").replace("\x00", "")), lines_before)
    if report is not None:
        order = {s.id: i for i, s in enumerate(default_signatures())}
        report.matches = sorted(matches.values(), key=lambda m: order.get(m.id, len(order)))
        if windows > 1:
            report.unread.append(f"The input is {read / 2**20:.0f} MiB: every signature was searched in all of it, "
                                 f"the tool readers read its first {(window_bytes or MAX_BYTES) // 2**20} MiB.")
    return report, read


def merge_reports(named: list[tuple[str, Report]]) -> Report:
    """One report of several inputs of one machine: kinds and facts merged (the first input stating a fact wins;
    per-GPU firmware keyed by input), unread sentences and signatures named by their input, contradictions found."""
    if len(named) == 1:
        name, report = named[0]
        report.inputs = [_input_dict(name, report)]
        return report
    kinds: list[str] = []
    facts: dict[str, Any] = {}
    unread: list[str] = []
    matches: list[Match] = []
    for name, report in named:
        kinds += [k for k in report.kinds if k not in kinds]
        own = dict(report.facts)
        if isinstance(own.get("firmware_by_gpu"), dict):
            own["firmware_by_gpu"] = {f"{name}: {gpu}": v for gpu, v in own["firmware_by_gpu"].items()}
        _merge(facts, own)
        unread += [f"{name}: {sentence}" for sentence in report.unread]
        matches += report.matches
    merged = Report(kinds, facts, unread, matches, [_input_dict(name, report) for name, report in named])
    merged.contradictions = crosscheck.contradictions([(name, r.kinds, r.facts) for name, r in named])
    return merged


def _input_dict(name: str, report: Report) -> dict[str, Any]:
    return {"input": name, "kinds": report.kinds, "facts": report.facts, "unread": report.unread,
            "signature_ids": [m.id for m in report.matches]}


def main(argv: list[str] | None = None, prog: str = "conformance diagnose") -> int:
    parser = build_parser(prog)
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    if ns.file.count("-") > 1:
        print(f"{prog}: standard input (-) can be read once only.", file=sys.stderr)
        return 2
    named: list[tuple[str, Report]] = []
    for path in ns.file:
        name = "stdin" if path == "-" else Path(path).name
        try:
            if path == "-":
                report, _ = diagnose_stream(sys.stdin.buffer)
            else:
                with open(path, "rb") as handle:
                    report, _ = diagnose_stream(handle)
        except OSError as exc:
            print(f"{prog}: cannot read {path}: {exc.strerror or exc}.", file=sys.stderr)
            return 2
        named.append((name, report if report is not None else Report([], {}, ["The input is empty."])))
    report = merge_reports(named)
    if ns.json:
        print(json.dumps(report.as_dict(), indent=2, ensure_ascii=False))
    else:
        print(render(report, named[0][0] if len(named) == 1 else f"{len(named)} inputs"))
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
