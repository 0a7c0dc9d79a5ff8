"""The signature catalogue (env_checks/signatures.toml) and its matcher: tolerant phrasing, the `also` pairing,
the kernel-log source filter, the Match record other modules rely on, and bad tables named by entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from env_checks.signatures import SignatureError, default_signatures, diagnose, load_signatures, match

SIGNATURES = default_signatures()
EXAMPLES = [(s.id, ex) for s in SIGNATURES for ex in s.examples]


@pytest.mark.parametrize("signature_id, message", EXAMPLES, ids=[f"{i}:{n}" for n, (i, _) in enumerate(EXAMPLES)])
def test_each_catalogue_example_matches_its_signature(signature_id: str, message: str) -> None:
    assert signature_id in [m.id for m in match(message)]


def test_the_catalogue_is_complete() -> None:
    ids = [s.id for s in SIGNATURES]
    assert len(ids) == len(set(ids)) >= 40
    for s in SIGNATURES:
        assert s.cause.endswith(".") and s.remedy.endswith("."), s.id
        assert s.link is None or s.link.startswith("https://"), s.id
        assert s.severity in ("fault", "warning", "info") and s.source in ("runtime", "kernel", "tool")
    kernel = {s.id for s in SIGNATURES if s.source == "kernel"}
    assert {"vf-reset-request", "amdgpu-page-fault", "amdgpu-ring-timeout", "amdgpu-mes-timeout",
            "amdgpu-gpu-reset", "amdgpu-ras-uncorrectable", "nvidia-xid-79", "nvidia-xid-48",
            "nvidia-xid-63-64", "nvidia-xid-94-95"} <= kernel
    # the seed runbook's symptoms are all in the catalogue
    assert {"hip-invalid-value", "device-oom", "hip-launch-out-of-resources", "hip-no-binary-for-gpu",
            "vllm-c-missing", "rocm613-kernel-5.15.0-105", "kv-cache-no-memory", "prompt-too-long",
            "rock-init-failed", "hsa-out-of-resources"} <= set(ids)


@pytest.mark.parametrize("message, signature_id", [
    ('HIP Error "invalid device function"', "hip-invalid-device-function"),
    ("hip error: Invalid Device Function", "hip-invalid-device-function"),
    ("RuntimeError: HIP error: invalid device function", "hip-invalid-device-function"),
    ("hipErrorInvalidDeviceFunction", "hip-invalid-device-function"),
    ("HIP error: hipErrorInvalidValue", "hip-invalid-value"),
    ("HIP error 701", "hip-launch-out-of-resources"),
    ("hip error: 701 too many resources requested for launch", "hip-launch-out-of-resources"),
    ("HIP error: out of memory", "device-oom"),
    ("hipErrorMemoryAllocation", "device-oom"),
    ('ModuleNotFoundError: No module named "vllm._C"', "vllm-c-missing"),
    ("kernel: [ 9001.1] vfio-pci 0000:81:00.0: Reset request for VF 0", "vf-reset-request"),
    ("Failed to initialize ROCk", "rock-init-failed"),
])
def test_tolerant_phrasing_is_matched(message: str, signature_id: str) -> None:
    found = diagnose(message)
    assert found is not None and found.signature.id == signature_id, (found and found.signature.id)


@pytest.mark.parametrize("message", [
    "No module named 'vllm._version'",  # a harmless warning, not the missing extension
    "HIP error handling is described in the docs",
    "NVRM: Xid (PCI:0000:3b:00): 7900, pid=1",  # not Xid 79
    "ROCm version: 6.1.3 on kernel 6.8.0-45-generic",  # the pairing needs the 5.15.0-105 kernel too
    "amdgpu 0000:c1:00.0: amdgpu: ring gfx_0.0.0 uses VM inv eng 0 on hub 0",
])
def test_near_misses_match_nothing(message: str) -> None:
    assert match(message) == []


def test_a_pairing_needs_both_halves() -> None:
    text = "ROCm version: 6.1.3\nPython platform: Linux-5.15.0-105-generic-x86_64-with-glibc2.35"
    assert [m.id for m in match(text)] == ["rocm613-kernel-5.15.0-105"]
    assert match(text)[0].severity == "warning"


def test_match_reports_the_first_line_its_number_and_the_count() -> None:
    log = ("[ 1.0] amdgpu 0000:0a:00.0: amdgpu: probe ok\n"
           "[ 2.0] amdgpu 0000:0a:00.0: amdgpu: GPU reset begin!\n"
           "[ 3.0] amdgpu 0000:0a:00.0: amdgpu: GPU reset succeeded, trying to resume\n")
    (found,) = match(log, source="kernel")
    assert (found.id, found.lineno, found.count, found.severity) == ("amdgpu-gpu-reset", 2, 2, "fault")
    assert found.line == "[ 2.0] amdgpu 0000:0a:00.0: amdgpu: GPU reset begin!"
    assert found.link and found.title and found.as_dict()["source"] == "kernel"
    assert match("RuntimeError: HIP error: invalid device function", source="kernel") == []


def test_a_bad_severity_or_duplicate_is_named(tmp_path: Path) -> None:
    table = tmp_path / "sig.toml"
    table.write_text('[[signature]]\nid = "odd"\npattern = "x"\ncause = "c."\nremedy = "r."\nseverity = "fatal"\n')
    with pytest.raises(SignatureError, match="signature odd in sig.toml has severity 'fatal'"):
        load_signatures(table)
    entry = '[[signature]]\nid = "twice"\npattern = "x"\ncause = "c."\nremedy = "r."\n'
    table.write_text(entry + entry)
    with pytest.raises(SignatureError, match="twice in sig.toml is defined twice"):
        load_signatures(table)
    table.write_text('[[signature]\nid = ')
    with pytest.raises(SignatureError, match="sig.toml is unreadable"):
        load_signatures(table)
