"""The dashboard's machine section: a run's telemetry series goes through the history store into inline SVG plots
(one line per GPU), with the machine-health verdict; a run without telemetry says why."""

from __future__ import annotations

from pathlib import Path

from reports import sitedata
from reports.history import History
from reports.render import render_page
from reports.telemetry_view import run_plots, series_plot
from tests.reports.conftest import make_record


def telemetry(n: int = 5) -> dict:
    samples = [{"t_s": float(t), "gpu": g, "temp_c": 40.0 + t + g, "power_w": 300.0 + 10 * t, "sm_clock_mhz": 1980.0,
                "mem_clock_mhz": 3201.0, "vram_used_mib": 1000.0 * t, "throttle": ["sw_power_cap"] if t == 3 else []}
               for t in range(n) for g in range(2)]
    return {"status": "sampling through nvml", "devices": ["NVIDIA H200", "NVIDIA H200"], "samples": samples}


def test_a_runs_telemetry_is_stored_and_plotted(tmp_path: Path) -> None:
    gpu = make_record("20250102T000000Z-cuda-000002", target="cuda", started_at="2025-01-02T00:00:00Z")
    gpu["telemetry"] = telemetry()
    gpu["machine_health"] = {"verdict": "fail", "faults": [{"id": "amdgpu-gpu-reset", "severity": "fault",
                                                            "title": "GPU reset"}], "warnings": []}
    cpu = make_record()
    cpu["telemetry"], cpu["machine_health"] = {"status": "off on the cpu target"}, {"verdict": "pass", "faults": [],
                                                                                    "warnings": []}
    with History.open(tmp_path / "h.sqlite") as history:
        assert history.ingest_record(gpu) and history.ingest_record(cpu)
        assert history.ingest_record(make_record("20250103T000000Z-cpu-000003", started_at="2025-01-03T00:00:00Z"))
        stored = history.health([gpu["run_id"], cpu["run_id"], "20250103T000000Z-cpu-000003"])
        assert stored[gpu["run_id"]] == ("fail", gpu["telemetry"]) and "20250103T000000Z-cpu-000003" not in stored
        data = sitedata.collect(history)
    html = render_page(data)
    section = html.split('<section id="machine">')[1].split("</section>")[0]
    assert "machine health: FAIL" in section and section.count('data-metric="temp_c"') == 1
    assert section.count("<polyline") == 8  # 4 metrics x 2 GPUs
    assert "Throttle reasons seen: sw_power_cap" in section
    # the latest CPU run recorded none (an older results.json): its card is left out, not faked
    assert "20250103T000000Z-cpu-000003" not in section


def test_no_samples_gives_the_reason_and_one_point_still_plots() -> None:
    assert "No telemetry: unavailable: nvml: ImportError" in run_plots({"status": "unavailable: nvml: ImportError"})
    one = series_plot([("GPU 0", [(0.0, 41.0)])], "Temperature", "°C")
    assert one.startswith("<svg") and "<polyline" in one
    assert "No temperature samples" in series_plot([("GPU 0", [])], "Temperature", "°C")
