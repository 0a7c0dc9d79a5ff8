"""Who else holds the GPU (conformance/engines/gpu_sharers.py): the suite's own processes are told from another
job's by descent, a listing of another pid namespace judges nothing, and NVML's and amdsmi's answers (in the shapes
their Python bindings return) are read. The serving check's refusal is controlled on its own body in
tests/controls/test_serving_perf_controls.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.engines import gpu_sharers
from conformance.engines.gpu_sharers import GpuProcess


def test_a_child_of_the_suite_is_its_own_and_a_detached_process_is_another_job() -> None:
    child = subprocess.Popen(["sleep", "60"])
    stranger = int(subprocess.run(["setsid", "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                  text=True, check=True).stdout)
    try:
        listing = [GpuProcess(0, os.getpid()), GpuProcess(0, child.pid, 2048.0), GpuProcess(1, stranger, 1024.0)]
        assert gpu_sharers.others(listing) == [GpuProcess(1, stranger, 1024.0)]
        assert GpuProcess(1, stranger, 1024.0).describe() == f"pid {stranger} (sleep) on GPU 1 holding 1.0 GiB"
    finally:
        child.kill()
        os.kill(stranger, 9)
        child.wait()


def test_a_listing_that_cannot_tell_judges_nothing() -> None:
    gone = 2**22 + 11  # above any pid_max: no such process here
    assert gpu_sharers.others(None) is None
    assert gpu_sharers.others([]) is None  # the suite's server holds the GPU: an empty listing is blind
    assert gpu_sharers.others([GpuProcess(0, gone)]) is None  # none of ours in it: another pid namespace
    assert gpu_sharers.others([GpuProcess(0, os.getpid()), GpuProcess(0, gone)]) == []  # exited since


def test_readings_merge_by_gpu_and_pid() -> None:
    a, b = GpuProcess(0, 10), GpuProcess(1, 10)
    assert gpu_sharers.merge(None, None) is None
    assert gpu_sharers.merge(None, []) == []
    assert gpu_sharers.merge([a], [a, b]) == [a, b]


@pytest.mark.skipif(any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/kfd")), reason="this host has a GPU")
def test_without_a_gpu_no_lister_answers() -> None:
    assert gpu_sharers.listed() is None


def test_nvml_s_answer_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-ml-py's shape: per device, objects with `pid` and `usedGpuMemory` (bytes, or None)."""
    procs = {0: [SimpleNamespace(pid=41, usedGpuMemory=3 * 2**30)], 1: [SimpleNamespace(pid=42, usedGpuMemory=None)]}
    calls = []
    fake = SimpleNamespace(nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
                           nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
                           nvmlDeviceGetComputeRunningProcesses=procs.__getitem__)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_sharers.listed() == [GpuProcess(0, 41, 3072.0), GpuProcess(1, 42, None)]
    assert calls == ["init", "shutdown"]


@pytest.mark.parametrize("binding", ["amdsmi 6/7: dicts", "amdsmi 5.7: handles"])
def test_amdsmi_s_answer_is_read(monkeypatch: pytest.MonkeyPatch, binding: str) -> None:
    """amdsmi's shape: `amdsmi_get_gpu_process_list` gives dicts with pid, name, mem and memory_usage.vram_mem
    (ROCm 6 and later), or handles that `amdsmi_get_gpu_process_info` turns into such dicts (ROCm 5.7)."""
    info = {"name": "python3", "pid": 77, "mem": 5, "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": 2**31}}
    dicts = binding.startswith("amdsmi 6")

    def no_nvml() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=no_nvml))
    monkeypatch.setitem(sys.modules, "amdsmi", SimpleNamespace(
        amdsmi_init=lambda: None, amdsmi_shut_down=lambda: None, amdsmi_get_processor_handles=lambda: ["gpu0"],
        amdsmi_get_gpu_process_list=lambda h: [info if dicts else "handle"],
        amdsmi_get_gpu_process_info=lambda h, p: info))
    assert gpu_sharers.listed() == [GpuProcess(0, 77, 2048.0, "python3")]
