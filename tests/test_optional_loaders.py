"""transformers as the engine under test loads GPTQ, AWQ and compressed-tensors FP8 only through optional packages:
where the environment lacks one, the shipped expectations (expectations/engine.toml) skip that format's quantized
checks with the package named, and nothing else. A vLLM engine under test is never excused this way."""

from __future__ import annotations

from conformance.run import capabilities
from tests.check_fakes import CollectedItem

CHECK = "conformance/checks/test_quantized.py::test_quantized_checkpoint_matches_reference"
IDS = [f"{CHECK}[{fmt}-{kind}]" for fmt in ("gptq", "awq", "fp8-channel", "fp8-tensor")
       for kind in ("under-test", "transformers")]
IDS.append("conformance/checks/test_quantized.py::test_mxfp4_checkpoint_matches_reference[under-test]")


def _skipped(run_info: dict) -> dict[str, str]:
    items = [CollectedItem(i) for i in IDS]
    capabilities.apply_expectations(items, run_info)
    return {i.nodeid.split("[")[1].rstrip("]"): i.markers[0].kwargs["reason"] for i in items if i.markers}


def test_missing_modules_lists_only_what_cannot_be_imported():
    entries = [{"when": {"missing_modules": ["json", "no_such_module_for_the_suite"]}},
               {"when": {"missing_modules": "another_missing_module_xyz"}}, {"when": {"engine": "vllm"}}]
    assert capabilities.missing_modules(entries) == ["another_missing_module_xyz", "no_such_module_for_the_suite"]
    assert set(capabilities.missing_modules()) <= {"optimum", "gptqmodel", "compressed_tensors"}


def test_a_missing_loader_skips_its_formats_and_names_the_package():
    run = {"target": "cuda", "engine": "transformers", "dtype": "bfloat16"}
    only_optimum = _skipped(run | {"missing_modules": ["optimum"]})
    assert sorted(only_optimum) == ["gptq-transformers", "gptq-under-test"]
    assert all("optimum and gptqmodel" in r and r.startswith("capability absent") for r in only_optimum.values())
    everything = _skipped(run | {"missing_modules": ["compressed_tensors", "gptqmodel", "optimum"]})
    assert len(everything) == 8 and "mxfp4-under-test" not in everything
    assert "compressed-tensors" in everything["fp8-tensor-under-test"]
    assert _skipped(run | {"missing_modules": []}) == {}


def test_a_vllm_engine_under_test_is_never_excused_by_a_missing_transformers_loader():
    missing = {"missing_modules": ["compressed_tensors", "gptqmodel", "optimum"]}
    for target in ("cuda", "rocm"):
        assert _skipped({"target": target, "engine": "vllm", "dtype": "bfloat16"} | missing) == {}
