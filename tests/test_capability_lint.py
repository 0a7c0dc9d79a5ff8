""""Not applicable" has one mechanism: a check module never compares the engine's or the target's name with a string
(the plugin's collection lint, conformance/run/capabilities.py `lint`), what it needs of the engine is a `needs`
capability of data/engines.toml, and an environment gap (no GPU, a module missing) an expectation in
data/expectations/environment.toml. So an engine that declares a capability is let into its checks by data alone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.checks import test_kv_accounting, test_kv_cache, test_reliability, test_stack_identity
from conformance.run import capabilities, run_target
from tests.check_fakes import CollectedItem
from tests.test_run_options import refused_at_collection

CHECKS = Path(capabilities.__file__).parent.parent / "checks"
BAD = '''import pytest


def test_a(engine, run, probe, target):
    if engine.info.get("engine") != "vllm":
        pytest.skip("not vLLM")
    if run.engine in ("vllm", "sglang"):
        pass
    if "cpu" == probe.info["platform"]:
        pass
    return target == "rocm"
'''
FINE = '''def test_b(engine, run, kind, dtype, target, layout):
    assert dtype == "float32" and layout != "mxfp4"      # not an engine or a target name
    assert kind != run.engine                             # two values, no name written down
    options = target.options_for("vllm")                  # a lookup by name, no comparison
    assert "vllm" == "vllm" and options is not None       # two constants decide nothing about the run
'''


def test_the_lint_names_each_comparison_with_an_engine_or_target_name_by_file_and_line():
    found = capabilities.name_comparisons(BAD, "checks/test_bad.py")
    assert [f.split(": ", 1)[0] for f in found] == ["checks/test_bad.py:5", "checks/test_bad.py:7",
                                                    "checks/test_bad.py:9", "checks/test_bad.py:11"]
    assert "`engine.info.get('engine') != 'vllm'` compares with the engine or target name 'vllm'" in found[0]
    assert all(f.endswith("(docs/adding-a-check.md).") and "@pytest.mark.needs" in f for f in found)


def test_the_lint_lets_other_comparisons_and_lookups_by_name_pass():
    assert capabilities.name_comparisons(FINE, "test_fine.py") == []


def test_the_names_come_from_the_data():
    assert capabilities.run_names() == set(capabilities.declared().engines) | set(run_target.names())
    assert capabilities.name_comparisons('x = run.engine == "sglang"', "t.py", names={"sglang"})
    assert capabilities.name_comparisons('x = run.engine == "sglang"', "t.py") == []  # not declared: not a name


def test_the_suites_checks_pass_the_lint():
    found = [f for p in sorted(CHECKS.glob("*.py")) for f in capabilities.name_comparisons(p.read_text(), p.name)]
    assert found == [], found


def test_the_plugin_refuses_a_check_that_compares_a_name_at_collection(tmp_path: Path):
    body = '    if run.engine != "vllm":\n        pytest.skip("not vLLM")\n'
    out = refused_at_collection(tmp_path, "test_named", body)
    assert "ERROR: test_named.py:11: `run.engine != 'vllm'` compares with the engine or target name 'vllm'" in out


# ------------------------------------------------------------------ what the name comparisons became


def _item(check) -> SimpleNamespace:
    marks = getattr(check, "pytestmark", [])
    return SimpleNamespace(iter_markers=lambda name: (m for m in marks if m.name == name))


# each check that skipped by comparing the engine's name, and the sentence transformers is skipped with
NO_PAGED_KV = "the transformers engine has no paged KV cache to inspect"
ENGINE_ONLY = [
    (test_kv_cache.test_kv_blocks_released_after_requests, NO_PAGED_KV),
    (test_kv_accounting.test_kv_block_count_matches_config, NO_PAGED_KV),
    (test_kv_accounting.test_request_holds_blocks_per_group, NO_PAGED_KV),
    (test_kv_accounting.test_kv_blocks_free_after_abort, NO_PAGED_KV),
    (test_kv_accounting.test_kv_blocks_do_not_leak_over_rounds, NO_PAGED_KV),
    (test_reliability.test_soak_no_growth, "the transformers engine has no scheduler to exercise"),
    (test_reliability.test_randomized_request_mixes_keep_invariants,
     "the transformers engine has no scheduler to exercise"),
    (test_stack_identity.test_vllm_platform_matches_target,
     "the engine under test is transformers: no vLLM platform to check"),
]


@pytest.mark.parametrize("check, sentence", ENGINE_ONLY, ids=[c.__name__ for c, _ in ENGINE_ONLY])
def test_an_engine_only_check_skips_transformers_and_runs_on_vllm(check, sentence):
    assert capabilities.skip_reason(_item(check), "transformers") == sentence
    assert capabilities.skip_reason(_item(check), "vllm") is None


@pytest.mark.parametrize("check", [c for c, _ in ENGINE_ONLY], ids=[c.__name__ for c, _ in ENGINE_ONLY])
def test_a_new_engine_declaring_the_capabilities_is_let_in_by_data_alone(check, monkeypatch):
    """An engine engines.toml adds with vLLM's capabilities runs these checks; with none it gets the same skip."""
    table = capabilities.declared()
    newcomer = capabilities.Capabilities(table.engines | {"sglang": table.engines["vllm"], "bare": frozenset()},
                                         table.absent)
    monkeypatch.setattr(capabilities, "declared", lambda: newcomer)
    assert capabilities.skip_reason(_item(check), "sglang") is None
    assert "bare" in capabilities.skip_reason(_item(check), "bare")


def test_a_new_engine_with_paged_kv_only_runs_the_paged_kv_checks():
    caps = capabilities.parse({"engines": {"sglang": {"capabilities": ["paged_kv"]}},
                               "capabilities": {"paged_kv": {"absent": "no paged KV on {engine}"},
                                                "scheduler": {"absent": "no scheduler on {engine}"}}})
    assert caps.missing("sglang", "paged_kv") is None
    assert caps.missing("sglang", "scheduler", "paged_kv") == "no scheduler on sglang"


DEVICE = "conformance/checks/test_device.py::"
GPU_ONLY = [f"{DEVICE}test_device_isa_in_build", f"{DEVICE}test_gemm_throughput_floor[bfloat16]",
            f"{DEVICE}test_hbm_bandwidth_floor"]
ANY_DEVICE = [f"{DEVICE}test_gemm_numerics[float32]"]
PERF = "conformance/checks/test_serving_perf.py::"
BENCH = [f"{PERF}test_serving_perf_against_baseline[c1]", f"{PERF}test_serving_perf_at_shape[1k-1k-c1]"]
NO_BENCH = [f"{PERF}test_graph_mode_matches_eager"]


def _skipped(run_info: dict) -> dict[str, str]:
    items = [CollectedItem(i) for i in GPU_ONLY + ANY_DEVICE + BENCH + NO_BENCH]
    environment = [e for e in capabilities.load_expectations() if e["file"] == "environment.toml"]
    capabilities.apply_expectations(items, run_info, environment)
    return {i.nodeid: i.markers[0].kwargs["reason"] for i in items if i.markers}


@pytest.mark.parametrize("target", run_target.names())
def test_the_gpu_only_device_checks_skip_where_the_target_has_no_device(target):
    needs_device = run_target.build(target).needs_device
    skipped = _skipped({"target": target, "needs_device": needs_device, "missing_modules": []})
    assert sorted(skipped) == ([] if needs_device else sorted(GPU_ONLY))
    assert all("no GPU device to check" in r for r in skipped.values())


def test_the_benchmark_checks_skip_where_vllms_client_cannot_be_imported():
    skipped = _skipped({"target": "cuda", "needs_device": True, "missing_modules": ["vllm"]})
    assert sorted(skipped) == sorted(BENCH)
    assert all(r == "vLLM's benchmark client (vllm bench serve) is not installed here" for r in skipped.values())
    assert _skipped({"target": "cuda", "needs_device": True, "missing_modules": []}) == {}
