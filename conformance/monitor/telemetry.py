"""GPU telemetry sampled in a background thread during a run: temperature, power, clocks, throttle reasons and
VRAM used, per GPU, as a time series (results.json `telemetry`), judged against per-SKU limits in
conformance/data/health.toml. Beside it, the host's share of CPU time busy and stolen by the hypervisor and its
load (`host`, through psutil, which vLLM brings): a small model's serving figures at concurrency 1 are the host's
Python and launch time, and a move there with the GPU's clocks steady is the host's (on the H200, 23-39% between
two runs of one stack).

Backends: NVML through `pynvml` (the `nvidia-ml-py` distribution) on CUDA; on ROCm the `amdsmi` Python
bindings when importable, else `amd-smi metric --json` in a subprocess. A backend that cannot start is
recorded with its reason (`status`), never silently skipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from conformance.engines import gpu_sharers, host_cpu
from env_checks.probes.amd_smi import parse_smi_tree

# NVML clocks-event (throttle) reason bits, nvmlClocksEventReason* in nvml.h (stable since NVML 3xx).
NVML_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
MAX_SAMPLES = 3600  # one hour at 1 Hz per GPU; a longer run keeps every other sample (see Sampler._trim)


@dataclass
class Sample:
    t_s: float  # seconds since the sampler started
    gpu: int
    temp_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    vram_used_mib: float | None = None
    throttle: list[str] = field(default_factory=list)


def nvml_reasons(mask: int) -> list[str]:
    return [name for bit, name in NVML_REASONS.items() if mask & bit]


class NvmlBackend:
    name = "nvml"

    def __init__(self) -> None:
        import pynvml  # nvidia-ml-py

        self.nv = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.names = [_text(pynvml.nvmlDeviceGetName(h)) for h in self.handles]

    def _get(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nv.NVMLError:
            return None

    def read(self, t_s: float) -> list[Sample]:
        nv, out = self.nv, []
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        for i, h in enumerate(self.handles):
            power = self._get(nv.nvmlDeviceGetPowerUsage, h)
            mem = self._get(nv.nvmlDeviceGetMemoryInfo, h)
            mask = self._get(reasons_fn, h)
            out.append(Sample(t_s, i, self._get(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                              power / 1000.0 if power is not None else None,
                              self._get(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                              self._get(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                              mem.used / 2**20 if mem is not None else None,
                              nvml_reasons(mask) if mask is not None else []))
        return out

    def close(self) -> None:
        self._get(self.nv.nvmlShutdown)


class AmdSmiBindingsBackend:
    name = "amdsmi"

    def __init__(self) -> None:
        import amdsmi

        self.a = amdsmi
        amdsmi.amdsmi_init()
        self.handles = amdsmi.amdsmi_get_processor_handles()
        self.names = [str(self._get(lambda h: amdsmi.amdsmi_get_gpu_asic_info(h)["market_name"], h) or "AMD GPU")
                      for h in self.handles]

    def _get(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - amdsmi raises AmdSmiLibraryException and KeyError for N/A metrics
            return None

    def read(self, t_s: float) -> list[Sample]:
        a, out = self.a, []
        for i, h in enumerate(self.handles):
            temp = self._get(a.amdsmi_get_temp_metric, h, a.AmdSmiTemperatureType.HOTSPOT,
                             a.AmdSmiTemperatureMetric.CURRENT)
            power = self._get(a.amdsmi_get_power_info, h) or {}
            gfx = self._get(a.amdsmi_get_clock_info, h, a.AmdSmiClkType.GFX) or {}
            mclk = self._get(a.amdsmi_get_clock_info, h, a.AmdSmiClkType.MEM) or {}
            vram = self._get(a.amdsmi_get_gpu_vram_usage, h) or {}
            watts = _num(power.get("current_socket_power")) or _num(power.get("average_socket_power"))
            out.append(Sample(t_s, i, _num(temp), watts, _num(gfx.get("clk")), _num(mclk.get("clk")),
                              _num(vram.get("vram_used")), []))
        return out

    def close(self) -> None:
        self._get(self.a.amdsmi_shut_down)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _num(value: Any) -> float | None:
    """12, '12.5 W', {'value': 12, 'unit': 'W'} -> a float; 'N/A' and the like -> None."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", str(value)) if value is not None else None
    return float(m.group(1)) if m else None


def parse_amd_smi_metric(text: str, t_s: float = 0.0) -> list[Sample]:
    """`amd-smi metric --json` (or its text form) as one Sample per GPU."""
    out = []
    for g in parse_smi_tree(text):
        temp, power, clock = g.get("temperature") or {}, g.get("power") or {}, g.get("clock") or {}
        mem = g.get("mem_usage") or {}
        status = str(power.get("throttle_status") or "").strip().upper()
        hottest = [v for v in (_num(temp.get(k)) for k in ("hotspot", "edge", "mem")) if v is not None]
        out.append(Sample(t_s, int(g["gpu"]), max(hottest) if hottest else None,
                          _num(power.get("socket_power")) or _num(power.get("average_socket_power")),
                          _num((clock.get("gfx_0") or {}).get("clk")), _num((clock.get("mem_0") or {}).get("clk")),
                          _num(mem.get("used_vram")), ["throttled"] if status == "THROTTLED" else []))
    return out


class AmdSmiCliBackend:
    name = "amd-smi metric"

    def __init__(self) -> None:
        self.names = []
        samples = self.read(0.0)  # raises if the tool is missing or its output unreadable
        self.names = ["AMD GPU"] * len(samples)
        try:
            static = json.loads(self._run(["amd-smi", "static", "--asic", "--json"]))
            rows = static.get("gpu_data", static) if isinstance(static, dict) else static
            self.names = [str((r.get("asic") or {}).get("market_name") or "AMD GPU") for r in rows]
        except (OSError, ValueError, AttributeError, subprocess.SubprocessError):
            pass

    @staticmethod
    def _run(argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout

    def read(self, t_s: float) -> list[Sample]:
        return parse_amd_smi_metric(self._run(["amd-smi", "metric", "--json"]), t_s)

    def close(self) -> None:
        pass


BACKENDS = {"cuda": (NvmlBackend,), "rocm": (AmdSmiBindingsBackend, AmdSmiCliBackend)}


@dataclass
class HostSample:
    t_s: float
    busy_pct: float  # CPU time not idle, of all cores, since the last sample
    steal_pct: float  # CPU time the hypervisor gave another guest (0 on bare metal)
    load_1m: float


class HostReader:
    """The host's CPU busy and steal shares since the previous read, and its 1-minute load."""

    def __init__(self) -> None:
        self._last = host_cpu.read()
        if self._last is None:
            raise ImportError("psutil is not installed")

    def read(self, t_s: float) -> HostSample:
        now = host_cpu.read()
        got, self._last = host_cpu.shares(self._last, now), now
        return HostSample(t_s, got.get("host_cpu_busy_pct", 0.0), got.get("host_cpu_steal_pct", 0.0),
                          round(os.getloadavg()[0], 2))


OTHERS_EVERY_S = 5.0  # how often the sampler lists the GPUs' processes for ones that are not the suite's


class Sampler:
    """Samples a backend (and the host) every `interval_s` seconds in a daemon thread until `stop()`; every
    OTHERS_EVERY_S it also lists the processes holding the GPUs and keeps those that are not the suite's
    (conformance/engines/gpu_sharers.py), with when they were seen."""

    def __init__(self, target: str, interval_s: float = 1.0, backends: tuple[type, ...] | None = None) -> None:
        self.interval_s, self.samples, self.errors = interval_s, [], []
        self.backend, self.status, self.names = None, "", []
        self.host: HostReader | None = None
        self.host_samples: list[HostSample] = []
        self.host_status = ""
        self.others: dict[tuple[int, int], dict[str, Any]] = {}
        self._stop, self._thread = threading.Event(), None
        self.started_at = time.time()
        reasons = []
        for cls in backends if backends is not None else BACKENDS.get(target, ()):
            try:
                self.backend = cls()
                self.names = list(self.backend.names)
                self.status = f"sampling through {self.backend.name}"
                break
            except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError, a missing tool: all are reasons
                reasons.append(f"{getattr(cls, 'name', cls.__name__)}: {type(exc).__name__}: {exc}"[:300])
        if self.backend is None:
            self.status = "unavailable: " + ("; ".join(reasons) or f"no telemetry backend for target {target}")
            return
        try:
            self.host, self.host_status = HostReader(), "sampling through psutil"
        except Exception as exc:  # noqa: BLE001 - psutil missing or unreadable: a stated reason, the GPU series goes on
            self.host_status = f"unavailable: {type(exc).__name__}: {exc}"[:300]

    def start(self) -> Sampler:
        if self.backend is not None:
            self._thread = threading.Thread(target=self._loop, name="conformance-telemetry", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        t0, listed_at = time.monotonic(), None
        while not self._stop.is_set():
            t_s = round(time.monotonic() - t0, 2)
            try:
                self.samples.extend(self.backend.read(t_s))
                if self.host is not None:
                    self.host_samples.append(self.host.read(t_s))
                if listed_at is None or t_s - listed_at >= OTHERS_EVERY_S:
                    listed_at = t_s
                    self._note_others(gpu_sharers.now() or [], t_s)
            except Exception as exc:  # noqa: BLE001 - one failed read is recorded, the series goes on
                if len(self.errors) < 20:
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            self._trim()
            self._stop.wait(self.interval_s)

    def _note_others(self, others: list[gpu_sharers.GpuProcess], t_s: float) -> None:
        for p in others:
            seen = self.others.setdefault((p.gpu, p.pid), {"gpu": p.gpu, "pid": p.pid, "what": p.describe(),
                                                           "first_s": t_s, "last_s": t_s})
            seen["last_s"] = t_s

    def _trim(self) -> None:
        if len(self.samples) > MAX_SAMPLES * max(1, len(self.names)):
            self.samples = self.samples[::2]
            self.host_samples = self.host_samples[::2]

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.backend is not None:
            self.backend.close()
        return {"status": self.status, "backend": getattr(self.backend, "name", None), "interval_s": self.interval_s,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at)),
                "devices": self.names, "errors": self.errors, "samples": [asdict(s) for s in self.samples],
                "host": {"status": self.host_status, "samples": [asdict(s) for s in self.host_samples]},
                "others": list(self.others.values())}


def judge(series: dict[str, Any], limits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings (dicts of env_checks.health.Finding's fields) for samples beyond the first matching limit, and a
    warning for each process not the suite's that held a GPU during the run."""
    out = [{"id": "gpu-shared", "severity": "warning", "source": "telemetry",
            "title": f"another process held a GPU during the run: {o['what']}",
            "detail": f"seen from {o['first_s']:.0f} s to {o['last_s']:.0f} s into the run; a serving level or device "
                      "floor that missed its mark meanwhile failed as shared_gpu"}
           for o in series.get("others") or []]
    for gpu, name in enumerate(series.get("devices") or []):
        limit = next((lim for lim in limits if lim["match"] in name), None)
        rows = [s for s in series.get("samples") or [] if s["gpu"] == gpu]
        if not rows:
            continue
        if limit is None:
            out.append({"id": "telemetry-no-limits", "severity": "warning", "source": "telemetry",
                        "title": f"GPU {gpu} ({name}) has no telemetry limits in health.toml: recorded, not judged",
                        "detail": f"{len(rows)} samples"})
            continue
        temps = [s["temp_c"] for s in rows if s["temp_c"] is not None]
        if temps and max(temps) > limit["max_temp_c"]:
            out.append({"id": "telemetry-over-temperature", "severity": "fault", "source": "telemetry",
                        "title": f"GPU {gpu} ({name}) ran hotter than {limit['max_temp_c']} C",
                        "detail": f"max {max(temps):.0f} C over {len(temps)} samples", "link": limit.get("link")})
        seen = sorted({r for s in rows for r in s["throttle"]} & set(limit.get("fail_throttle", [])))
        if seen:
            out.append({"id": "telemetry-throttled", "severity": "fault", "source": "telemetry",
                        "title": f"GPU {gpu} ({name}) throttled: {', '.join(seen)}",
                        "detail": f"{sum(1 for s in rows if set(s['throttle']) & set(seen))} of {len(rows)} samples",
                        "link": limit.get("link")})
    return out
