"""GPU telemetry: the sampler thread, the NVML and amd-smi readers, and the per-SKU limits that judge a series.
The NVML reader runs here against a stand-in module with pynvml's names (the real one is exercised on the GPU
runs); the amd-smi reader against its JSON and text forms."""

from __future__ import annotations

import sys
import time
import types

from conformance.monitor import machine_health, telemetry


class FakeBackend:
    name = "fake"
    names = ["NVIDIA H200"]

    def __init__(self) -> None:
        self.calls = 0

    def read(self, t_s):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("sensor busy")
        return [telemetry.Sample(t_s, 0, 60.0 + self.calls, 300.0, 1980.0, 2619.0, 1024.0 * self.calls, [])]

    def close(self):
        pass


def test_sampler_records_a_series_and_read_errors():
    sampler = telemetry.Sampler("cuda", interval_s=0.01, backends=(FakeBackend,)).start()
    time.sleep(0.2)
    series = sampler.stop()
    assert series["status"] == "sampling through fake" and series["devices"] == ["NVIDIA H200"]
    assert len(series["samples"]) >= 3 and series["errors"][0] == "RuntimeError: sensor busy"
    assert [s["t_s"] for s in series["samples"]] == sorted(s["t_s"] for s in series["samples"])
    host = series["host"]  # the host beside the GPU: real psutil readings of this machine
    assert host["status"] == "sampling through psutil" and len(host["samples"]) >= 2
    assert all(0 <= h["busy_pct"] <= 100 and 0 <= h["steal_pct"] <= 100 and h["load_1m"] >= 0 for h in host["samples"])


def test_a_host_without_psutil_is_a_stated_reason_and_the_gpu_series_goes_on(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    series = telemetry.Sampler("cuda", interval_s=0.01, backends=(FakeBackend,)).start()
    time.sleep(0.1)
    series = series.stop()
    assert series["host"]["status"] == "unavailable: ImportError: psutil is not installed"
    assert series["host"]["samples"] == []
    assert series["samples"], "the GPU series does not depend on the host's"


def test_a_backend_that_cannot_start_is_a_stated_reason():
    class Broken:
        name = "nvml"

        def __init__(self):
            raise ImportError("No module named 'pynvml'")

    series = telemetry.Sampler("cuda", backends=(Broken,)).start().stop()
    assert series["status"] == "unavailable: nvml: ImportError: No module named 'pynvml'" and series["samples"] == []
    assert telemetry.Sampler("cpu").status == "unavailable: no telemetry backend for target cpu"


def test_nvml_reader_against_pynvmls_names(monkeypatch):
    class NVMLError(Exception):
        pass

    def power(handle):
        raise NVMLError("Not Supported")

    fake = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}", nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetTemperature=lambda h, sensor: 41, nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetClockInfo=lambda h, clock: {1: 1980, 2: 3201}[clock],
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=3 * 2**30),
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x1 | 0x40)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    backend = telemetry.NvmlBackend()
    (sample,) = backend.read(1.5)
    assert backend.names == ["NVIDIA H200"]
    assert (sample.temp_c, sample.power_w, sample.sm_clock_mhz, sample.mem_clock_mhz, sample.vram_used_mib) == (
        41, None, 1980, 3201, 3072.0)
    assert sample.throttle == ["gpu_idle", "hw_thermal_slowdown"]


def test_amd_smi_metric_json_and_text():
    js = ('{"gpu_data": [{"gpu": 0, "power": {"socket_power": {"value": 717, "unit": "W"}, '
          '"throttle_status": "UNTHROTTLED"}, "clock": {"gfx_0": {"clk": {"value": 2100, "unit": "MHz"}}, '
          '"mem_0": {"clk": {"value": 1300, "unit": "MHz"}}}, "temperature": {"edge": "N/A", '
          '"hotspot": {"value": 71, "unit": "C"}, "mem": {"value": 60, "unit": "C"}}, '
          '"mem_usage": {"used_vram": {"value": 2048, "unit": "MB"}}}]}')
    (s,) = telemetry.parse_amd_smi_metric(js, 2.0)
    assert (s.temp_c, s.power_w, s.sm_clock_mhz, s.mem_clock_mhz, s.vram_used_mib, s.throttle) == (
        71.0, 717.0, 2100.0, 1300.0, 2048.0, [])
    text = ("GPU: 0\n    POWER:\n        SOCKET_POWER: 20 W\n        THROTTLE_STATUS: THROTTLED\n"
            "    CLOCK:\n        GFX_0:\n            CLK: 14 MHz\n")
    (t,) = telemetry.parse_amd_smi_metric(text)
    assert (t.power_w, t.sm_clock_mhz, t.throttle, t.temp_c) == (20.0, 14.0, ["throttled"], None)


def limits():
    return machine_health.load_policy("cuda")[1]


def series(temps, throttle=()):
    return {"devices": ["NVIDIA H200"], "samples": [
        {"gpu": 0, "t_s": float(i), "temp_c": t, "throttle": list(throttle)} for i, t in enumerate(temps)]}


def test_limits_judge_temperature_and_throttle_reasons():
    assert telemetry.judge(series([40, 55, 60], ["sw_power_cap", "gpu_idle"]), limits()) == []
    (hot,) = telemetry.judge(series([40, 91]), limits())
    assert hot["id"] == "telemetry-over-temperature" and "max 91 C" in hot["detail"] and "87 C" in hot["title"]
    (slow,) = telemetry.judge(series([40], ["hw_slowdown"]), limits())
    assert slow["id"] == "telemetry-throttled" and "hw_slowdown" in slow["title"]
    unknown_sku = {"devices": ["NVIDIA L4"], "samples": [{"gpu": 0, "t_s": 0.0, "temp_c": 120, "throttle": []}]}
    (unjudged,) = telemetry.judge(unknown_sku, limits())
    assert (unjudged["id"], unjudged["severity"]) == ("telemetry-no-limits", "warning")


def test_a_process_not_the_suite_s_on_the_gpu_during_the_run_is_a_warning(monkeypatch):
    """The sampler lists the GPUs' processes (every OTHERS_EVERY_S, the first at once) and keeps those that are not
    the suite's, with when they were seen; the machine-health findings warn of each (correctness verdicts stand; a
    serving level or floor missed meanwhile fails as shared_gpu on its own)."""
    import os
    import subprocess

    from conformance.engines import gpu_sharers
    from conformance.engines.gpu_sharers import GpuProcess

    stranger = int(subprocess.run(["setsid", "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                  text=True, check=True).stdout)
    try:
        monkeypatch.setattr(gpu_sharers, "listed", lambda: [GpuProcess(0, os.getpid()), GpuProcess(0, stranger, 4096.)])
        sampler = telemetry.Sampler("cuda", interval_s=0.01, backends=(FakeBackend,)).start()
        time.sleep(0.1)
        series = sampler.stop()
    finally:
        os.kill(stranger, 9)
    (seen,) = series["others"]  # listed once: the next listing is OTHERS_EVERY_S later
    assert seen["first_s"] == seen["last_s"] < 1.0
    assert seen | {"first_s": 0, "last_s": 0} == {"gpu": 0, "pid": stranger, "first_s": 0, "last_s": 0,
                                                  "what": f"pid {stranger} (sleep) on GPU 0 holding 4.0 GiB"}
    (warning,) = [f for f in telemetry.judge(series, []) if f["id"] == "gpu-shared"]
    assert warning["severity"] == "warning" and f"pid {stranger} (sleep)" in warning["title"]
    monkeypatch.setattr(gpu_sharers, "listed", lambda: [GpuProcess(0, os.getpid())])
    alone = telemetry.Sampler("cuda", interval_s=0.01, backends=(FakeBackend,)).start()
    time.sleep(0.05)
    assert alone.stop()["others"] == []
