"""Capabilities as data (conformance/run/capabilities.py, data/engines.toml): a check that needs what its engine
lacks is skipped with the sentence recorded runs carry, an undeclared capability or a malformed engines.toml
is one sentence, and no check repeats an `if run.engine != ...` skip."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.run import capabilities
from conformance.run.capabilities import CapabilityError

CHECKS = Path(capabilities.__file__).parent.parent / "checks"
# the sentences the engine-only skips wrote before they became data (recorded runs and the dashboard carry them)
RECORDED = {
    "paged_kv": "the transformers engine has no paged KV cache to inspect",
    "scheduler": "the transformers engine has no scheduler to exercise",
    "request_queue": "the transformers engine has no request queue to exercise",
    "prefix_cache": "the transformers engine has no prefix cache",
    "chunked_prefill": "the transformers engine has no chunked prefill",
    "tensor_parallel": "the engine under test is transformers: tensor parallelism is a vLLM feature",
    "fp8_kv": "kv_cache_dtype is a vLLM option; this run's engine is transformers",
    "memory_budget": "the preflight sizes vLLM's memory budget; this run's engine is transformers",
    "long_context": "the long-context checks configure vLLM's max_model_len and scheduler; engine is transformers",
    "server": "the engine under test is transformers: there is no vLLM server to start",
    "server_process": "the engine under test is transformers: there is no vLLM server to kill",
}


def item_needing(*caps: str) -> SimpleNamespace:
    marks = [SimpleNamespace(args=caps)] if caps else []
    return SimpleNamespace(iter_markers=lambda name: iter(marks if name == capabilities.MARKER else []))


@pytest.mark.parametrize("capability", sorted(RECORDED))
def test_a_check_needing_what_transformers_lacks_is_skipped_with_the_recorded_sentence(capability):
    assert capabilities.skip_reason(item_needing(capability), "transformers") == RECORDED[capability]
    assert capabilities.skip_reason(item_needing(capability), "vllm") is None


def test_require_skips_from_a_fixture_with_the_capability_sentence():
    with pytest.raises(pytest.skip.Exception, match="no paged KV cache to inspect"):
        capabilities.require(SimpleNamespace(engine="transformers"), "paged_kv")
    capabilities.require(SimpleNamespace(engine="vllm"), "paged_kv")  # vLLM has it: no skip


def test_an_engine_engines_toml_does_not_declare_has_nothing():
    assert capabilities.skip_reason(item_needing("scheduler"), "sglang") == \
        "the sglang engine has no scheduler to exercise"


def test_an_unmarked_check_runs_on_any_engine():
    assert capabilities.skip_reason(item_needing(), "transformers") is None


def test_a_capability_engines_toml_does_not_declare_is_one_sentence():
    with pytest.raises(CapabilityError, match=r"no capability 'paged_kvv' in engines.toml .*\[capabilities.paged_kvv"):
        capabilities.skip_reason(item_needing("paged_kvv"), "vllm")


@pytest.mark.parametrize("table, message", [
    ({}, "needs an \\[engines.NAME\\] table"),
    ({"engines": {"vllm": {"capabilities": ["x"]}}, "capabilities": {"x": {}}}, "has no absent sentence"),
    ({"engines": {"vllm": {}}, "capabilities": {"x": {"absent": "no x"}}}, "has no capabilities list"),
    ({"engines": {"vllm": {"capabilities": ["y"]}}, "capabilities": {"x": {"absent": "no x"}}},
     "lists y, which no \\[capabilities.NAME\\] table declares"),
])
def test_a_malformed_engines_toml_is_one_sentence(table, message):
    with pytest.raises(CapabilityError, match=message) as info:
        capabilities.parse(table)
    assert str(info.value).count(". ") == 0 and str(info.value).endswith(".")


def test_the_setup_hook_skips_before_the_fixtures_and_fails_an_undeclared_capability():
    from conformance.run.runcontext import RUN_KEY

    config = SimpleNamespace(stash={RUN_KEY: SimpleNamespace(engine="transformers")})
    item = item_needing("prefix_cache")
    item.config = config
    with pytest.raises(pytest.skip.Exception, match="the transformers engine has no prefix cache"):
        capabilities.pytest_runtest_setup(item)
    bad = item_needing("prefix_cash")
    bad.config = config
    with pytest.raises(pytest.fail.Exception, match="no capability 'prefix_cash'"):
        capabilities.pytest_runtest_setup(bad)


def test_no_check_skips_on_the_engine_name_in_code():
    pattern = re.compile(r"if\s+(?:\w+\s+and\s+)?run\.engine\s*[!=]=\s*\"vllm\"")
    offenders = [f"{p.name}:{n}" for p in sorted(CHECKS.glob("test_*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not offenders, f"engine-only skips written as code (declare a capability instead): {offenders}"


def test_every_marked_capability_is_declared():
    named = {m for p in CHECKS.glob("test_*.py") for m in re.findall(r'needs\("(\w+)"\)', p.read_text())}
    assert named, "no check uses the needs marker"
    assert named <= set(capabilities.declared().absent), named - set(capabilities.declared().absent)
