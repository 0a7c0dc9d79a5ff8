"""Negative controls that run the platform checks' own bodies — stack identity, pins, device ISA, GEMM numerics,
throughput and HBM floors, collectives (a real gloo launch with a rank counted twice) and their bandwidth floor,
TP sharding, quantized loading — against a known-bad stack or input, and see each fail naming the fault."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conformance import distributed
from conformance.checkpoints.quant.checkpoint import dequantized_copy, quantized
from conformance.checks import test_collectives as collective_checks
from conformance.checks import test_device as device_checks
from conformance.checks import test_quantized as quantized_checks
from conformance.checks import test_stack_identity as identity
from conformance.checks import test_tp_sharding as tp_checks
from conformance.distributed import collectives
from conformance.distributed import tp_reference as tpref
from conformance.engines.worker import EngineError
from conformance.reference import Reference
from conformance.run import run_target
from conformance.run.targets import TargetReport
from conformance.verdicts import device
from env_checks.probes import code_object_scan, isa
from tests.check_fakes import FAILED, Figures, ScriptedEngine, ScriptedEngines, target_of

MI300X = {"platform": "rocm", "name": "AMD Instinct MI300X", "isa": "gfx942", "isa_full": "gfx942:sramecc+:xnack-",
          "arch_list": ["gfx942"]}


def test_torch_build_check_fails_on_a_cpu_torch_for_the_rocm_target():
    bad = TargetReport("rocm", "rocm", torch_flavour="cpu",
                       problems=["target rocm needs a ROCm build of torch, found a CPU build."])
    target = run_target.build("rocm", report=bad)
    with pytest.raises(FAILED, match="needs a ROCm build of torch"):
        identity.test_torch_build_matches_target(target, Figures())


def test_pins_check_fails_when_the_vllm_version_cannot_be_read():
    fp = {"platform": {"accelerator": "none", "python": "3.11.7", "cpu_flags": ["avx2"]},
          "packages": {"torch": "2.13.0+cpu", "vllm": None, "vllm_distribution": None}}
    with pytest.raises(FAILED, match="manifest cpu.toml: .*vllm_version unknown"):
        identity.test_stack_pins_hold(target_of("cpu"), fp, Figures())


def test_pins_check_names_the_missing_manifest_on_a_card_without_one():
    """Round nineteen's first H100 P0 failed with `manifest None: no pin was evaluated`; the sentence now says what
    is missing. (h100.toml exists since: the recorded H100 fingerprint passes below.)"""
    fp = {"platform": {"accelerator": "nvidia", "gpu_names": ["NVIDIA L4"], "compute_caps": ["8.9"]},
          "packages": {"torch": "2.11.0+cu130", "vllm": "0.26.0"}}
    with pytest.raises(FAILED, match="no pin manifest matches this platform: add one under env_checks/pins/"):
        identity.test_stack_pins_hold(target_of("cuda"), fp, Figures())


def test_the_recorded_h100_fingerprint_holds_the_h100_pins():
    import json
    from pathlib import Path

    fp = json.loads(Path("fixtures/device_runs/20261205T162601-bench-p0-L16-second-node-1/fingerprint.json")
                    .read_text())
    figures = Figures()
    identity.test_stack_pins_hold(target_of("cuda"), fp, figures)
    assert figures.values["pins_checked"] == 9 and figures.values["pins_failed"] == 0


# ------------------------------------------------------------------ device


def probe_of(info: dict, **answers) -> ScriptedEngine:
    return ScriptedEngine(answers, **info)


def test_device_isa_check_fails_on_an_mi250_build_on_an_mi300x(monkeypatch):
    monkeypatch.setattr(device, "library_isa", lambda info, engine: isa.IsaVerdict())
    monkeypatch.setattr(code_object_scan, "installed", code_object_scan.CodeObjectScan)  # no raw code objects
    probe = probe_of(MI300X | {"arch_list": ["gfx90a"]})
    with pytest.raises(FAILED, match="without gfx942 code objects"):
        device_checks.test_device_isa_in_build(probe, target_of("rocm"), Figures())


AITER_WHEEL = Path(__file__).resolve().parent.parent / "fixtures" / "tools" / "isa" / "aiter"


def _aiter_scan(tmp_path: Path, arch: str | None) -> code_object_scan.CodeObjectScan:
    """The scan of an aiter installed in tmp_path from the amd-aiter wheel's real code objects: all of them, or
    only the hsa/<arch>/ set."""
    site = tmp_path / "site-packages"
    shutil.copytree(AITER_WHEEL / "aiter_meta", site / "aiter_meta",
                    ignore=None if arch is None else lambda d, names: [n for n in names if n.startswith("gfx")
                                                                       and n != arch])
    return code_object_scan.scan([code_object_scan.Root("aiter", str(site / "aiter_meta"), "package")])


def test_device_isa_check_fails_on_a_library_with_only_gfx950_code_objects(monkeypatch, tmp_path):
    """An MI300X (gfx942) whose AITER carries the wheel's gfx950 kernels only: the check names the library and both
    ISAs before any of its kernels is loaded (vllm-project/vllm#32895 found it as hipErrorNoBinaryForGpu)."""
    monkeypatch.setattr(device, "library_isa", lambda info, engine: isa.IsaVerdict())
    only_gfx950 = _aiter_scan(tmp_path, "gfx950")
    monkeypatch.setattr(code_object_scan, "installed", lambda: only_gfx950)
    figures = Figures()
    with pytest.raises(FAILED, match=r"aiter cannot run on gfx942:sramecc\+:xnack-: none of its 2 AMDGPU code "
                                     r"objects is for it, they are for gfx950 \(2\)"):
        device_checks.test_device_isa_in_build(probe_of(MI300X), target_of("rocm"), figures)
    assert figures.values["amdgpu_code_objects_for_device"] == 0


def test_device_isa_check_passes_with_gfx942_code_objects_beside_gfx950_ones(monkeypatch, tmp_path):
    monkeypatch.setattr(device, "library_isa", lambda info, engine: isa.IsaVerdict())
    both = _aiter_scan(tmp_path, None)
    monkeypatch.setattr(code_object_scan, "installed", lambda: both)
    figures = Figures()
    device_checks.test_device_isa_in_build(probe_of(MI300X), target_of("rocm"), figures)
    assert (figures.values["amdgpu_code_objects_for_device"], figures.values["amdgpu_code_objects_for_other_isas"],
            figures.values["amdgpu_code_object_libraries_mixed"]) == (4, 2, 1)


def test_the_raw_code_object_scan_is_not_applicable_on_cuda(monkeypatch):
    monkeypatch.setattr(code_object_scan, "installed", lambda: pytest.fail("scanned on CUDA"))
    raw = device.raw_code_object_isa({"platform": "cuda", "isa": "sm_90"}, "vllm")
    assert not raw.problems and raw.figures() == {"amdgpu_code_objects_applicable": 0.0}
    assert raw.not_applicable.startswith("raw AMDGPU code objects: not applicable on cuda")


class _WrongGemm:
    """A device whose GEMM is 1% off on every entry (think: a broken kernel for the shape's tail tiles)."""

    info = {"platform": "cpu"}

    def call(self, method, m, k, n, dtype, seed, rows, cols, tf32=False, timeout_s=None):
        gen = torch.Generator().manual_seed(seed)
        a = torch.randn(len(rows), k, generator=gen).to(getattr(torch, dtype))
        w = torch.randn(len(cols), k, generator=gen).to(getattr(torch, dtype))
        c = (a.double() @ w.double().t() * 1.01).to(getattr(torch, dtype))
        return {"a": a, "w": w, "c": c}


def test_gemm_numerics_check_fails_on_a_gemm_off_by_one_percent():
    with pytest.raises(FAILED, match=r"(\d+) of \1 float32 GEMM shapes out of tolerance .*relative error 0.01"):
        device_checks.test_gemm_numerics("float32", _WrongGemm(), 1.0, Figures())


def test_gemm_throughput_check_fails_below_the_floor():
    probe = probe_of(MI300X, gemm_tflops=100.0)
    with pytest.raises(FAILED, match="bfloat16 GEMM 100 TFLOP/s is below the floor 552"):
        device_checks.test_gemm_throughput_floor("bfloat16", probe, 1.0, Figures())


def test_hbm_bandwidth_check_fails_below_the_floor():
    probe = probe_of(MI300X, copy_gbps=1000.0)
    with pytest.raises(FAILED, match="copy bandwidth 1000 GB/s is below the floor 3700"):
        device_checks.test_hbm_bandwidth_floor(probe, 1.0, Figures())


def _floor_on_a_shared_gpu(monkeypatch, floor):
    """The floor's own body with the GPU's listing showing the probe (this process) and a real process that is not
    the suite's: a missed floor fails as `shared_gpu` naming it; a floor met on the shared GPU stands (sharing only
    slows), and the measurement records the other process either way."""
    import os
    import subprocess

    from conformance.engines import gpu_sharers
    from conformance.engines.gpu_sharers import GpuProcess
    from conformance.run import runrecord
    from conformance.verdicts.shared_gpu import GpuShared

    stranger = int(subprocess.run(["setsid", "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                  text=True, check=True).stdout)
    monkeypatch.setattr(gpu_sharers, "listed", lambda: [GpuProcess(0, os.getpid()), GpuProcess(0, stranger, 8192.0)])

    def check(value, figures):
        if floor == "gemm":
            device_checks.test_gemm_throughput_floor("bfloat16", probe_of(MI300X, gemm_tflops=value), 1.0, figures)
        else:
            device_checks.test_hbm_bandwidth_floor(probe_of(MI300X, copy_gbps=value), 1.0, figures)
    try:
        figures = Figures()
        with pytest.raises(GpuShared, match=f"below the floor .* another process held the GPU while this was "
                                            f"measured: pid {stranger} \\(sleep\\) on GPU 0 holding 8.0 GiB") as info:
            check(100.0, figures)
        assert figures.values["gpu_foreign_processes"] == 1.0
        assert runrecord.classify("failed", str(info.value), runrecord.exception_chain(info.value)) == "shared_gpu"
        figures = Figures()
        check(10_000.0, figures)
        assert figures.values["gpu_foreign_processes"] == 1.0
    finally:
        os.kill(stranger, 9)


def test_a_gemm_floor_missed_on_a_shared_gpu_fails_as_shared(monkeypatch):
    _floor_on_a_shared_gpu(monkeypatch, "gemm")


def test_an_hbm_floor_missed_on_a_shared_gpu_fails_as_shared(monkeypatch):
    _floor_on_a_shared_gpu(monkeypatch, "hbm")


def test_device_floors_fail_when_the_probe_errors():
    class Broken:
        info = MI300X

        def call(self, *args, **kwargs):
            raise EngineError("device probe died (signal 11)")
    with pytest.raises(FAILED, match="device probe died"):
        device_checks.test_hbm_bandwidth_floor(Broken(), 1.0, Figures())


# ------------------------------------------------------------------ collectives


@pytest.fixture(scope="module")
def gloo_launch():
    launch, reason = distributed.collective_plan("cpu", 0)
    assert launch is not None, reason
    return launch, distributed.data()["collectives"]["cpu"]


def test_collective_exact_check_fails_when_a_rank_is_counted_twice(gloo_launch, monkeypatch):
    """A real 2-rank gloo all_reduce with rank 0's contribution added twice (collectives.run_op's fault)."""
    real = distributed.launch
    monkeypatch.setattr(collectives, "cases_for", lambda row: [("int32", 4096)])
    monkeypatch.setattr(distributed, "launch", lambda launch, fn, *args: real(launch, fn, *args, "rank_counted_twice"))
    with pytest.raises(FAILED, match="all_reduce int32 4096 B: .* elements wrong"):
        collective_checks.test_collective_results_exact("all_reduce", gloo_launch, Figures())


def test_collective_bandwidth_check_fails_below_the_floor(gloo_launch, monkeypatch):
    """Ranks that took 100 s for the message (sockets instead of shared memory, say)."""
    monkeypatch.setattr(distributed, "launch", lambda launch, fn, *args: [100.0, 100.0])
    with pytest.raises(FAILED, match="bus bandwidth .* is below the floor"):
        collective_checks.test_collective_bus_bandwidth("all_reduce", gloo_launch, Figures())


# ------------------------------------------------------------------ tensor parallelism (the fp64 sharding)


def test_tp_sharding_check_fails_when_a_partial_is_never_all_reduced(monkeypatch):
    """Each rank's partial attention/MoE output returned as if it were the sum (no all-reduce): half of it."""
    def launch(plan, fn, path, layers, alignment, tokens, seed):
        out = tpref.layer_outputs(Reference(path), layers, tokens, seed)
        buf = io.BytesIO()
        torch.save({k: v / 2 for k, v in out.items()}, buf)
        return [buf.getvalue()]
    monkeypatch.setattr(distributed, "launch", launch)
    with pytest.raises(FAILED, match="TP sharding tiny plain TP 2"):
        tp_checks.test_tp_sharding_recombines_to_unsharded("tiny", "plain", 2, {}, Figures())


# ------------------------------------------------------------------ quantized loading


def test_model_quantization_check_fails_on_a_truncated_shard(tmp_path):
    bad = tmp_path / "truncated"
    shutil.copytree(quantized("gptq"), bad)
    shard = bad / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4096])
    with pytest.raises(FAILED, match="truncated"):
        quantized_checks.test_model_quantization_is_well_formed(SimpleNamespace(path=bad), Figures())


def misreading_engine(reference_dir, misread: str | None, tmp_path, methods: dict) -> ScriptedEngines:
    """An engine whose loader reads the checkpoint wrongly: its logprobs are the fp64 scores of the misread weights."""
    ref = Reference(dequantized_copy(reference_dir, tmp_path / "misread", misread=misread) if misread
                    else reference_dir)

    def generate(prompts, max_tokens, top_k, prompt_logprobs=False):
        return [ref.score(p, [], top_k) for p in prompts]  # prefill logprobs of the misread weights
    engine = ScriptedEngine({"components:quant_methods": methods, "generate_greedy": generate})
    return ScriptedEngines(engine, by_key=lambda o: engine)


def test_quantized_check_fails_on_a_loader_that_reverses_gptq_nibbles(tmp_path, tiny_prompts):
    methods = {"model.layers.0.attn.qkv_proj": "AutoGPTQLinearMethod/CPUWNA16LinearKernel",
               "model.layers.0.attn.o_proj": "AutoGPTQLinearMethod/CPUWNA16LinearKernel"}
    engines = misreading_engine(quantized("gptq"), "gptq_nibbles_reversed", tmp_path, methods)
    prompts = SimpleNamespace(prompts=[p[:24] for p in tiny_prompts[0]], max_tokens=2)
    with pytest.raises(FAILED, match="exceeds the tolerance"):
        quantized_checks.test_quantized_checkpoint_matches_reference("gptq", "under-test", engines, target_of(),
                                                                     prompts, 1.0, Figures())


def test_quantized_check_fails_when_the_transformers_engine_under_test_lacks_a_loader(tmp_path, tiny_prompts):
    """Fail-open closed: an ImportError of the engine UNDER TEST is a failure, not a 'capability absent' skip."""
    class NoLoader(ScriptedEngine):
        def call(self, method, *args, **kwargs):
            raise EngineError("Traceback ...\nImportError: Loading a GPTQ model requires optimum")
    engines = ScriptedEngines(NoLoader(), by_key=lambda o: NoLoader())
    prompts = SimpleNamespace(prompts=[p[:24] for p in tiny_prompts[0]], max_tokens=2)
    with pytest.raises(FAILED, match="requires optimum"):
        quantized_checks.test_quantized_checkpoint_matches_reference("gptq", "under-test", engines,
                                                                     target_of(engine="transformers"), prompts, 1.0,
                                                                     Figures())
    with pytest.raises(pytest.skip.Exception, match="capability absent"):  # the helper engine: named, skipped
        quantized_checks.test_quantized_checkpoint_matches_reference("gptq", "transformers", engines, target_of(),
                                                                     prompts, 1.0, Figures())


def test_quantized_check_fails_on_an_internal_crash_that_mentions_importerror(tiny_prompts):
    class Crash(ScriptedEngine):
        def call(self, method, *args, **kwargs):
            raise EngineError("Traceback ...\n  ImportError was handled here\nRuntimeError: CUDA error: illegal access")
    engines = ScriptedEngines(Crash(), by_key=lambda o: Crash())
    prompts = SimpleNamespace(prompts=[p[:24] for p in tiny_prompts[0]], max_tokens=2)
    with pytest.raises(FAILED, match="illegal access"):
        quantized_checks.test_quantized_checkpoint_matches_reference("gptq", "transformers", engines, target_of(),
                                                                     prompts, 1.0, Figures())


def test_mxfp4_check_fails_on_a_loader_that_swaps_nibbles(tmp_path, tiny_prompts, monkeypatch):
    from safetensors.torch import load_file, save_file

    from conformance.checkpoints.crafted import mxfp4

    src = mxfp4()
    bad = tmp_path / "nibbles_swapped"
    shutil.copytree(src, bad)
    w = load_file(str(src / "model.safetensors"))
    for name in [n for n in w if n.endswith("_blocks")]:
        w[name] = ((w[name] & 0x0F) << 4) | (w[name] >> 4)
    save_file(w, str(bad / "model.safetensors"))
    methods = {"model.layers.0.mlp.experts": "Mxfp4MoEMethod"}
    engines = misreading_engine(bad, None, tmp_path, methods)
    prompts = SimpleNamespace(prompts=[p[:24] for p in tiny_prompts[0]], max_tokens=2)
    with pytest.raises(FAILED, match="exceeds the tolerance|not applied|chose"):
        quantized_checks.test_mxfp4_checkpoint_matches_reference("under-test", engines, target_of(), prompts, 1.0,
                                                                 Figures())
