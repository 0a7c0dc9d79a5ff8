"""Target resolution: `--rocm` on the wrong torch build fails with one clear sentence."""

from __future__ import annotations

from conformance.run import run_target

CPU_TORCH = {"torch_version": "2.13.0+cpu", "hip_version": None, "cuda_version": None,
             "torch_flavour": "cpu", "devices": [], "gcn_arch": []}
CUDA_TORCH = {"torch_version": "2.11.0+cu130", "hip_version": None, "cuda_version": "13.0",
              "torch_flavour": "cuda", "devices": ["NVIDIA H200"], "gcn_arch": []}
ROCM_TORCH = {"torch_version": "2.9.0+rocm7.0", "hip_version": "7.0.5", "cuda_version": None,
              "torch_flavour": "rocm", "devices": ["AMD Instinct MI300X"] * 8,
              "gcn_arch": ["gfx942:sramecc+:xnack-"] * 8}


def test_rocm_on_cpu_torch_fails_with_one_sentence():
    report = run_target.resolve("rocm", CPU_TORCH)
    assert report.problems and len(report.problems) == 1
    sentence = report.sentence()
    assert "--rocm" in sentence and "2.13.0+cpu" in sentence and "CPU build" in sentence
    assert sentence.count(". ") == 0 and sentence.endswith(".")


def test_rocm_on_cuda_torch_fails():
    assert "CUDA build" in run_target.resolve("rocm", CUDA_TORCH).sentence()


def test_cuda_on_rocm_torch_fails():
    assert run_target.resolve("cuda", ROCM_TORCH).problems


def test_gpu_target_without_visible_device_fails():
    report = run_target.resolve("rocm", ROCM_TORCH | {"devices": [], "gcn_arch": []})
    assert "sees no GPU" in report.sentence()


def test_matching_stacks_pass():
    assert not run_target.resolve("rocm", ROCM_TORCH).problems
    assert not run_target.resolve("cuda", CUDA_TORCH).problems
    assert not run_target.resolve("cpu", CPU_TORCH).problems


def test_auto_picks_the_visible_gpu_else_cpu():
    assert run_target.resolve("auto", ROCM_TORCH).resolved == "rocm"
    assert run_target.resolve("auto", CPU_TORCH).resolved == "cpu"
    assert run_target.resolve("auto", CUDA_TORCH | {"devices": []}).resolved == "cpu"


def test_missing_torch_is_a_problem_not_a_crash():
    assert "torch cannot be imported" in run_target.resolve("cpu", {"error": "torch cannot be imported (x)"}).sentence()


def test_every_target_s_engines_carry_the_server_s_date():
    """vLLM hashes VLLM_SYSTEM_START_DATE into its torch.compile cache key: engines and the suite's server of every
    target carry the same one, or the server compiles again (19 s of a 132-s start on the H200)."""
    from conformance.run.serving_fixtures import SERVER_DATE

    targets = {name: row for name, row in run_target.data().items() if isinstance(row, dict) and "env" in row}
    assert {"cpu", "cuda", "rocm"} <= set(targets)
    assert {name: row["env"].get("VLLM_SYSTEM_START_DATE") for name, row in targets.items()} == \
        dict.fromkeys(targets, SERVER_DATE)
