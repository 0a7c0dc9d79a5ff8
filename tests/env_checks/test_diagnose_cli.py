"""`conformance diagnose` as a user runs it: --help, --json, stdin, exit codes, and no traceback on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "fixtures" / "tools"


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "conformance", "diagnose", *args], input=stdin,
                          capture_output=True, env=env, cwd=REPO, timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def test_help_explains_what_it_reads_and_the_exit_codes() -> None:
    out = run("--help")
    assert out.returncode == 0
    for word in ("rocminfo", "amd-smi", "rocm-smi", "nvidia-smi", "collect_env", "journalctl", "--json",
                 "Exit codes: 0 no known fault signature, 1 fault signature(s) found, 2 unreadable"):
        assert word in out.stdout, word


def test_json_on_a_healthy_recording() -> None:
    out = run("--json", str(TOOLS / "rocminfo_mi300x_8gpu_rocm6.2.3.txt"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["kinds"] == ["rocminfo"] and report["exit_code"] == 0 and report["signatures"] == []
    assert report["facts"]["gpu_count"] == 8 and report["facts"]["gfx_targets"] == ["gfx942"]


def test_stdin_with_a_fault_exits_1_and_names_the_remedy() -> None:
    log = (TOOLS / "issues/dmesg_ring-timeout_mes_gpu-reset_legacy-6273.excerpt.txt").read_bytes()
    out = run("-", stdin=log)
    assert out.returncode == 1, out.stderr
    assert out.stdout.startswith("stdin: kernel log")
    assert "[fault] amdgpu-gpu-reset" in out.stdout and "remedy:" in out.stdout and "see:" in out.stdout
    assert len(out.stdout.splitlines()) <= 40  # one screen


def test_tolerant_phrasing_through_stdin_json() -> None:
    out = run("--json", "-", stdin=b'Traceback (most recent call last):\nRuntimeError: HIP Error "invalid device '
                                   b'function"\n')
    report = json.loads(out.stdout)
    assert out.returncode == 1 and [s["id"] for s in report["signatures"]] == ["hip-invalid-device-function"]


def test_unreadable_input_exits_2_with_one_sentence_and_no_traceback() -> None:
    for args, stdin in ((("-",), b""), ((str(TOOLS / "derived/binary-noise.derived.bin"),), None),
                        (("no-such-file.txt",), None), ((), None)):
        out = run(*args, stdin=stdin)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "Traceback" not in out.stdout + out.stderr
    assert "cannot read no-such-file.txt" in run("no-such-file.txt").stderr
    assert "Could not read: The input is empty." in run("-", stdin=b"").stdout


def test_a_truncated_copy_says_what_could_not_be_read() -> None:
    out = run(str(TOOLS / "rocminfo_mi300x_vf_truncated.derived.txt"))
    assert out.returncode == 0
    assert "gpu_count_at_least" in out.stdout and "Could not read: The rocminfo output ends before" in out.stdout
    assert "virtualization" in out.stdout and "VF" in out.stdout


def test_a_ras_fault_at_the_end_of_a_100_mb_kernel_log_is_found_in_seconds(tmp_path, capsys):
    """diagnose reads every byte, window by window: the newest line of a 100 MB dmesg (25 windows; a RAS fault) is
    found and named, exit 1, while memory stays bounded by the window (the input is never held whole). It took 216 s
    when every signature's regex scanned every window; the substrings each needs (env_checks/prefilter.py) rule
    most out at once: ~5 s here (2 cores), ~7 s and 38 MiB traced peak under tracemalloc."""
    import time
    import tracemalloc

    from env_checks.diagnose import main as diagnose_main

    log = tmp_path / "dmesg.txt"
    line = b"[ 1234.567890] amdgpu 0000:1c:00.0: amdgpu: ring gfx_0.0.0 test passed, heartbeat ok\n"
    with open(log, "wb") as out:
        block = line * 20_000
        while out.tell() < 100 * 2**20:
            out.write(block)
        out.write(b"[99999.000001] amdgpu 0000:1c:00.0: {1}uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) "
                  b"detected!\n")
    lines = log.read_bytes().count(b"\n")
    tracemalloc.start()
    started = time.perf_counter()
    code = diagnose_main([str(log), "--json"])
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and [s["id"] for s in report["signatures"]] == ["amdgpu-ras-uncorrectable"]
    assert report["signatures"][0]["lineno"] == lines  # the last line, by its number
    assert any("every signature was searched in all of it" in u for u in report["unread"])
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.0f} MiB for a 100 MB input"
    assert seconds < 90, f"{seconds:.0f} s for a 100 MB input (every regex over every window again?)"
    with capsys.disabled():
        print(f"\n100 MB kernel log: {seconds:.1f} s, peak {peak / 2**20:.1f} MiB traced")
