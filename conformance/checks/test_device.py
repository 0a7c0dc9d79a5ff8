"""The device: ISA support in the installed build, GEMM numerics per dtype (P0), and GEMM throughput
and HBM bandwidth against per-SKU floors (P2). Work runs in a child process like an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import device
from conformance.engines.worker import EngineError

AREA = "device"
DTYPES = ["float32", "bfloat16", "float16", "float8"]


@pytest.fixture(scope="session")
def probe(engines):
    try:
        return engines.get(model=Path("-"), kind="device")
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)


def _gpu(probe) -> dict:
    if probe.info["platform"] == "cpu":
        pytest.skip("target cpu: no GPU device to check")
    return probe.info


@pytest.mark.p0
def test_device_isa_in_build(probe, record_figure):
    """The GPU's ISA (gfx942 for MI300X, sm_90 for H100/H200) is the one its SKU needs, and the
    installed torch carries code objects for it.

    Catches: a wheel built for gfx90a/MI250 on an MI300X (kernels fail with 'invalid device function'),
    a CUDA build without sm_90, a partitioned or virtual device reporting another arch.
    Reference: https://rocm.docs.amd.com/en/latest/reference/gpu-arch-specs.html
    """
    info = _gpu(probe)
    sku = device.sku_for(info.get("name"))
    record_figure("arch_list_len", len(info.get("arch_list", [])))
    problems = device.isa_problems(info.get("isa"), info.get("arch_list", []), sku and sku["isa"])
    assert not problems, "; ".join(problems)


@pytest.mark.p0
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_numerics(dtype, probe, call_timeout_s, record_figure):
    """A device GEMM in each dtype matches fp64 on the same rounded inputs within the dtype's
    accumulation tolerance (data/devices.toml).

    Catches: tf32 silently used for fp32, fp16/bf16 accumulation in low precision, broken hipBLASLt /
    cuBLAS kernels for a shape, FP8 GEMM paths returning garbage, NaN from uninitialised workspaces.
    Reference: https://pytorch.org/docs/stable/notes/numerical_accuracy.html
    """
    gpu = probe.info["platform"] != "cpu"
    if dtype == "float8":
        sku = device.sku_for(probe.info.get("name"))
        if not gpu or not (sku and sku.get("fp8")):
            pytest.skip(f"no FP8 GEMM on {probe.info.get('name') or 'the CPU'} (devices.toml)")
    m, k, n = device.devices()["gemm_numerics"]["shape"]["gpu" if gpu else "cpu"]
    try:
        out = probe.call("gemm", m, k, n, dtype, timeout_s=call_timeout_s)
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)
    verdict = device.gemm_verdict(dtype, out["a"], out["b"], out["c"])
    record_figure("gemm_rel_err", verdict.rel_err)
    assert verdict.ok, verdict.message()


@pytest.mark.p2
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_throughput_floor(dtype, probe, call_timeout_s, record_figure):
    """Dense GEMM throughput per dtype, timed with device events after warm-up (median of repeats),
    is at or above the SKU's floor; the ratio to the vendor peak is recorded.

    Catches: a stack that is correct but slow — hipBLASLt tuning lost in an upgrade, power capping,
    clocks stuck low, a GEMM falling back to a generic kernel.
    Reference: https://rocm.docs.amd.com/projects/ROCmValidationSuite/en/latest/ (GST level-4 targets: MI300X
      bf16 552, fp16 523, fp8 981 TFLOP/s)
    """
    info = _gpu(probe)
    sku = device.sku_for(info.get("name"))
    if not sku or dtype not in sku.get("floor_tflops", {}):
        pytest.skip(f"no {dtype} throughput floor for {info.get('name')} in devices.toml")
    cfg = device.devices()["gemm_throughput"]
    try:
        tflops = probe.call("gemm_tflops", *cfg["gpu_shape"], dtype, cfg["warmup"], cfg["repeats"],
                            timeout_s=call_timeout_s)
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)
    record_figure(f"tflops_{dtype}", tflops)
    record_figure("ratio_to_peak", tflops / sku["peak_tflops"][dtype])
    floor = sku["floor_tflops"][dtype]
    assert tflops >= floor, f"{dtype} GEMM {tflops:.0f} TFLOP/s is below the floor {floor:.0f} for {sku['name']}"


@pytest.mark.p2
def test_hbm_bandwidth_floor(probe, call_timeout_s, record_figure):
    """A device-to-device copy moves at least the SKU's floor in GB/s (bytes read + written).

    Catches: HBM running degraded (memory clock, ECC storms, a bad partition mode), wrong NUMA/NPS setup.
    Reference: https://rocm.docs.amd.com/en/latest/reference/gpu-arch-specs.html (peak HBM bandwidth)
    """
    info = _gpu(probe)
    sku = device.sku_for(info.get("name"))
    if not sku:
        pytest.skip(f"no bandwidth floor for {info.get('name')} in devices.toml")
    cfg = device.devices()["bandwidth"]
    try:
        gbps = probe.call("copy_gbps", cfg["bytes"], cfg["repeats"], timeout_s=call_timeout_s)
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)
    record_figure("hbm_gbps", gbps)
    record_figure("ratio_to_peak", gbps / sku["peak_hbm_gbps"])
    floor = sku["floor_hbm_gbps"]
    assert gbps >= floor, f"copy bandwidth {gbps:.0f} GB/s is below the floor {floor:.0f} for {sku['name']}"
