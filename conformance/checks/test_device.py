"""The device: ISA support in the installed build and its native libraries, GEMM numerics per dtype (P0), and
GEMM throughput and HBM bandwidth against per-SKU floors (P2). Device work runs in a child process like an
engine; the fp64 references and the library scan run here. On a target without a GPU (targets.toml
needs_device = false) the GPU-only checks are skipped by data/expectations/environment.toml."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.engines.worker import EngineError
from conformance.verdicts import device, shared_gpu
from conformance.verdicts.verdict import Problems, at_least, fail, record_figures

AREA = "device"
DTYPES = ["float32", "bfloat16", "float16", "float8"]
NUMERIC_DTYPES = ["float32", "tf32", "bfloat16", "float16", "float8"]


@pytest.fixture(scope="session")
def probe(engines):
    try:
        return engines.get(model=Path("-"), kind="device")
    except EngineError as exc:
        fail(str(exc))


@pytest.mark.p0
def test_device_isa_in_build(probe, target, record_figure):
    """The GPU's ISA (gfx942 for MI300X, sm_90 for H100/H200) is the one its SKU needs; torch's arch list names
    it; the native libraries of torch and vLLM (libtorch_hip/libtorch_cuda, vllm/_C...) carry code objects
    that load on it, read from their offload bundles / fatbins (env_checks.isa; vLLM's only fail the check when
    vLLM is the engine under test); and on ROCm every library that loads raw AMDGPU code objects at run time
    (AITER's `.co` sets, Triton's and AITER's `.hsaco`, AITER's JIT modules; the Triton, AITER, Inductor and vLLM
    caches) has code for this ISA: the gfx target and xnack/sramecc of each ELF header and metadata note
    (env_checks.code_object_scan, scanned when the run header is printed, before any engine starts, and kept in
    the fingerprint). A library whose every code object is for another ISA fails, naming it and the ISAs it has;
    one with per-arch sets (gfx942 and gfx950) is a figure and a note; another GPU's kernels in a cache are notes.

    Catches: a wheel built for gfx90a/MI250 on an MI300X (kernels fail with 'invalid device function'),
    a CUDA build without sm_90, a vLLM built for other GPUs than torch, a partitioned or virtual device
    reporting another arch, an AITER without this GPU's kernels or a code object under hsa/gfx942/ built for
    another GPU (hipErrorNoBinaryForGpu hours into a run, when the kernel is first loaded).
    Reference: https://rocm.docs.amd.com/en/latest/reference/gpu-arch-specs.html ;
      https://clang.llvm.org/docs/ClangOffloadBundler.html ; https://docs.nvidia.com/cuda/cuda-binary-utilities/ ;
      https://llvm.org/docs/AMDGPUUsage.html#amdgpu-elf-header ; https://github.com/vllm-project/vllm/issues/32895
    Limits: devices.toml [isa] tool_timeout_s; devices.toml [isa.other_generation];
      devices.toml [isa.code_objects] platforms; devices.toml [isa.code_objects.loaded_by]
    Controls: tests/controls/test_device_controls.py::test_device_isa_check_fails_on_an_mi250_build_on_an_mi300x,
      tests/controls/test_device_controls.py::test_device_isa_check_fails_on_a_library_with_only_gfx950_code_objects
    """
    info = probe.info
    sku = device.sku_for(info.get("name"))
    record_figure("arch_list_len", len(info.get("arch_list", [])))
    problems = device.isa_problems(info.get("isa"), info.get("arch_list", []), sku and sku["isa"])
    libraries = device.library_isa(info, target.engine)
    record_figures(record_figure, libraries)
    problems += libraries.problems
    raw = device.raw_code_object_isa(info, target.engine)
    record_figures(record_figure, raw)
    problems += raw.problems
    read = "; ".join(f"{lib}: {how}" for lib, how in libraries.sources.items())
    note = (f" (targets read: {read})" if read else "") + "".join(f"; {n}" for n in raw.notes)
    Problems(problems, note=note).raise_if_failed()


@pytest.mark.p0
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_gemm_numerics(dtype, probe, call_timeout_s, record_figure):
    """A device GEMM in each dtype, over gpt-oss shapes (K = 2880; M = 1, 7, 128, 129, 4096; N = 2880, 5760,
    201088) and odd ones, matches fp64 on the same rounded inputs within the dtype's tolerances, on a sample of
    entries (data/devices.toml: shapes, sample, tolerances; fresh inputs every run, the seed recorded).

    Catches: tf32 used for fp32 (NVIDIA_TF32_OVERRIDE, a library ignoring the flag), fp16/bf16 accumulation in
    low precision, a broken hipBLASLt / cuBLAS kernel for one shape or its tail tiles (M = 129, N = 2883), FP8
    GEMM paths returning garbage, NaN from uninitialised workspaces.
    Reference: https://pytorch.org/docs/stable/notes/numerical_accuracy.html
    Limits: devices.toml [gemm_numerics.tolerance.<dtype>]
    Controls: tests/controls/test_device_controls.py::test_gemm_numerics_check_fails_on_a_gemm_off_by_one_percent
    """
    plan = device.gemm_plan(dtype, probe.info)
    if plan.skip:
        pytest.skip(plan.skip)
    seed = device.fresh_seed()
    verdicts = []
    for i, shape in enumerate(plan.shapes):
        shape_seed = (seed + i) % 2**31
        rows, cols = device.gemm_sample(shape, shape_seed)
        try:
            out = probe.call("gemm_sample", *shape, plan.probe_dtype, shape_seed, rows, cols, tf32=plan.tf32,
                             timeout_s=call_timeout_s)
        except EngineError as exc:
            record_figure("seed", seed)
            fail(f"{dtype} GEMM M={shape[0]} K={shape[1]} N={shape[2]} (seed {shape_seed}): {exc}")
        verdicts.append(device.gemm_verdict(dtype, out["a"], out["w"].t(), out["c"], shape=shape))
    report = device.GemmReport(dtype, seed, verdicts, plan.not_applicable)
    figures = report.figures()
    record_figures(record_figure, report)
    if plan.tf32:  # 0 where the stack computes fp32 anyway (NVIDIA_TF32_OVERRIDE=0, no xf32 on the GPU)
        record_figure("tf32_effective", float(figures["gemm_rel_err"] > device.gemm_tolerance("float32").rel_fro))
    report.raise_if_failed()


@pytest.mark.p2
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_throughput_floor(dtype, probe, call_timeout_s, record_figure):
    """Dense GEMM throughput per dtype, timed with device events after warm-up (median of repeats),
    is at or above the SKU's floor; the ratio to the vendor peak is recorded.

    Catches: a stack that is correct but slow — hipBLASLt tuning lost in an upgrade, power capping,
    clocks stuck low, a GEMM falling back to a generic kernel. A floor missed while another process held the GPU
    fails as `shared_gpu`, naming it, not as the stack's failure.
    Reference: https://rocm.docs.amd.com/projects/ROCmValidationSuite/en/latest/ (GST level-4 targets: MI300X
      bf16 552, fp16 523, fp8 981 TFLOP/s)
    Limits: devices.toml [device] floor_tflops
    Controls: tests/controls/test_device_controls.py::test_gemm_throughput_check_fails_below_the_floor,
      tests/controls/test_device_controls.py::test_a_gemm_floor_missed_on_a_shared_gpu_fails_as_shared
    """
    info = probe.info
    sku = device.sku_for(info.get("name"))
    if not sku or dtype not in sku.get("floor_tflops", {}):
        pytest.skip(f"no {dtype} throughput floor for {info.get('name')} in devices.toml")
    cfg = device.devices()["gemm_throughput"]
    watch = shared_gpu.Watch()
    try:
        tflops = probe.call("gemm_tflops", *cfg["gpu_shape"], dtype, cfg["warmup"], cfg["repeats"],
                            timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    watch.stop()
    record_figures(record_figure, {f"tflops_{dtype}": tflops, "ratio_to_peak": tflops / sku["peak_tflops"][dtype]}
                   | watch.figures())
    floor = sku["floor_tflops"][dtype]
    verdict = at_least(tflops, floor, f"{dtype} GEMM {tflops:.0f} TFLOP/s is below the floor {floor:.0f} for "
                       f"{sku['name']}", f"tflops_{dtype}", f"devices.toml {sku['name']} floor_tflops.{dtype}")
    record_figures(record_figure, verdict)  # the floor it was held to
    with watch.explains():
        verdict.raise_if_failed()


@pytest.mark.p2
def test_hbm_bandwidth_floor(probe, call_timeout_s, record_figure):
    """A device-to-device copy moves at least the SKU's floor in GB/s (bytes read + written).

    Catches: HBM running degraded (memory clock, ECC storms, a bad partition mode), wrong NUMA/NPS setup. A floor
    missed while another process held the GPU fails as `shared_gpu`, naming it.
    Reference: https://rocm.docs.amd.com/en/latest/reference/gpu-arch-specs.html (peak HBM bandwidth)
    Limits: devices.toml [device] floor_hbm_gbps
    Controls: tests/controls/test_device_controls.py::test_hbm_bandwidth_check_fails_below_the_floor,
      tests/controls/test_device_controls.py::test_device_floors_fail_when_the_probe_errors,
      tests/controls/test_device_controls.py::test_an_hbm_floor_missed_on_a_shared_gpu_fails_as_shared
    """
    info = probe.info
    sku = device.sku_for(info.get("name"))
    if not sku:
        pytest.skip(f"no bandwidth floor for {info.get('name')} in devices.toml")
    cfg = device.devices()["bandwidth"]
    watch = shared_gpu.Watch()
    try:
        gbps = probe.call("copy_gbps", cfg["bytes"], cfg["repeats"], timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    watch.stop()
    record_figures(record_figure, {"hbm_gbps": gbps, "ratio_to_peak": gbps / sku["peak_hbm_gbps"]} | watch.figures())
    floor = sku["floor_hbm_gbps"]
    verdict = at_least(gbps, floor, f"copy bandwidth {gbps:.0f} GB/s is below the floor {floor:.0f} for "
                       f"{sku['name']}", "hbm_gbps", f"devices.toml {sku['name']} floor_hbm_gbps")
    record_figures(record_figure, verdict)
    with watch.explains():
        verdict.raise_if_failed()
