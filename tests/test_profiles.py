"""Serving profiles (conformance/verdicts/profiles.py, data/profiles.toml): selection, merge, and bad choices."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from conformance.run import run_target
from conformance.verdicts import profiles

SKUS = ("MI300X", "MI325X", "MI355X", "H100", "H200", "cpu")


def test_the_data_holds_a_production_profile_per_sku_and_model():
    table = profiles.data()
    for sku in SKUS:
        models = {r["model"] for r in table["profile"].values() if r["sku"] == sku and r["production"]}
        assert models == ({"tiny"} if sku == "cpu" else set(profiles.MODELS)), sku
    for name, row in table["profile"].items():
        p = profiles.profile(name)  # every backend row named exists
        if row["sku"] != "cpu" and row["model"] != "tiny" and row["production"]:
            assert p.vllm["enforce_eager"] is False, name  # graph mode on in production
            assert p.vllm["gpu_memory_utilization"] >= 0.85 and p.vllm["max_model_len"] == 131072, name


def test_aiter_on_and_off_are_rows_of_the_mi300x_matrix():
    p = profiles.profile("mi300x-gpt-oss-120b")
    on, off = p, profiles.profile("mi300x-gpt-oss-120b", "rocm-triton-aiter-off")
    assert on.engine_env()["VLLM_ROCM_USE_AITER"] == "1" and off.engine_env()["VLLM_ROCM_USE_AITER"] == "0"
    assert on.engine_options()["attention_backend"] == "ROCM_AITER_UNIFIED_ATTN"
    assert off.label == "mi300x-gpt-oss-120b:rocm-triton-aiter-off" and on.label == "mi300x-gpt-oss-120b"


def test_cpu_default_is_exactly_targets_toml():
    p = profiles.select(None, "cpu", [], "tiny", "float32")
    assert p.name == "cpu" and p.engine_options() == {} and p.engine_env() == {}
    assert p.record()["vllm"] == {}
    assert run_target.data()["cpu"]["vllm"]["max_model_len"] == 1024  # unchanged


@pytest.mark.parametrize("device,model,want", [
    ("AMD Instinct MI300X", "gpt-oss-120b", "mi300x-gpt-oss-120b"),
    ("AMD Instinct MI300X VF", "tiny", "mi300x-tiny"),
    ("AMD Instinct MI325X", "gpt-oss-20b", "mi325x-gpt-oss-20b"),
    ("AMD Instinct MI355X", "gpt-oss-120b", "mi355x-gpt-oss-120b"),
    ("NVIDIA H200", "gpt-oss-120b", "h200-gpt-oss-120b"),
    ("NVIDIA H100 80GB HBM3", "gpt-oss-20b", "h100-gpt-oss-20b"),
])
def test_default_is_the_production_profile_of_the_detected_sku(device, model, want):
    target = "rocm" if "AMD" in device else "cuda"
    dtype = "bfloat16" if model != "tiny" or target == "rocm" else "float32"
    assert profiles.select(None, target, [device], model, dtype).name == want


def test_an_unknown_gpu_runs_targets_toml_as_is():
    p = profiles.select(None, "cuda", ["NVIDIA A100-SXM4-80GB"], "tiny", "float32")
    assert p.name == "cuda-default" and p.engine_options() == {}


@pytest.mark.parametrize("dtype,row", [("bfloat16", "cuda-auto"), ("float16", "cuda-triton"),
                                       ("float32", "cuda-auto")])
def test_the_h200_default_row_is_the_first_that_serves_the_dtype(dtype, row):
    """First contact on the H200: vLLM's own choice there (FlashAttention 3) refused fp16 ("We only support bf16
    dtype for S aux": FA3 takes attention sinks in bf16 only); an fp16 run takes the Triton row instead."""
    p = profiles.select(None, "cuda", ["NVIDIA H200"], "tiny", dtype)
    assert (p.name, p.backend.name) == ("h200-tiny", row)


def test_model_key_from_config():
    assert profiles.model_key({"hidden_size": 2880, "num_local_experts": 128}) == "gpt-oss-120b"
    assert profiles.model_key({"hidden_size": 2880, "num_local_experts": 32}) == "gpt-oss-20b"
    assert profiles.model_key({"hidden_size": 128, "num_local_experts": 8}) == "tiny"
    assert profiles.model_key(None) == "tiny"


@pytest.mark.parametrize("requested,target,dtype,words", [
    ("no-such", "cpu", "float32", "there is no serving profile 'no-such'"),
    ("mi300x-gpt-oss-120b", "cpu", "float32", "is for the rocm target"),
    ("mi300x-gpt-oss-120b:cuda-flash-attn", "rocm", "bfloat16", "has no backend row 'cuda-flash-attn'"),
    ("h200-gpt-oss-120b:cuda-flash-attn", "cuda", "float32", "serves bfloat16, not float32"),
    ("h200-gpt-oss-120b:cuda-flash-attn", "cuda", "float16", "serves bfloat16, not float16"),
])
def test_bad_profile_choices_fail_in_one_sentence(requested, target, dtype, words):
    with pytest.raises(profiles.ProfileError, match=words) as err:
        profiles.select(requested, target, ["NVIDIA H200"], "gpt-oss-120b", dtype)
    assert "\n" not in str(err.value)


def test_fp8_kv_format_and_cpu_isa_skip_are_data():
    assert profiles.kv_fp8_format("rocm", ["gfx942:sramecc+:xnack-"]) == "e4m3fnuz"
    assert profiles.kv_fp8_format("rocm", ["gfx950"]) == "e4m3fn"
    assert profiles.kv_fp8_format("cuda") == "e4m3fn"
    assert "AVX-512 or AMX" in profiles.kv_fp8_unsupported("cpu", "avx2")
    assert profiles.kv_fp8_unsupported("cpu", "avx512") is None


def test_run_help_lists_profile(capsys):
    from conformance.run import cli

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "--profile" in capsys.readouterr().out


@pytest.mark.parametrize("dtype, backend", [("float16", "TRITON_ATTN"), ("bfloat16", None)])
def test_the_server_serves_on_the_profile_row_the_engines_run(dtype, backend, tmp_path):
    """First contact on the H200 in fp16 (fixtures/device_runs/20261203T165918-cuda-c2aa9b): the engines ran the
    profile's TRITON_ATTN row, the server vLLM's own choice (FlashAttention 3, bf16 sinks only), and every chat
    request died ("We only support bf16 dtype for S aux"). The server now takes the profile and its row."""
    from conformance.run import serving_fixtures
    from tests.check_fakes import target_of

    target = target_of("cuda", dtype=dtype, devices=["NVIDIA H200"])
    model = SimpleNamespace(path=tmp_path, name="tiny")
    server = serving_fixtures.new_server(target, model, tmp_path, tmp_path / "server.log")
    assert server.options.get("attention_backend") == backend
    assert server.options["max_model_len"] == target.profile.engine_options()["max_model_len"]
    assert server.options["dtype"] == dtype


@pytest.mark.parametrize("dtype, backend", [("float16", "TRITON_ATTN"), ("bfloat16", None), ("float32", None)])
def test_an_engine_of_another_dtype_takes_the_profile_row_that_serves_it(dtype, backend, tmp_path):
    """First contact of P1 on the H200 (fixtures/device_runs/20261203T215707-cuda-f40b72): beside a bf16 run on
    vLLM's own choice (FA3), the GPTQ and AWQ engines, which run fp16 (data/quant.toml), died at their start ("We
    only support bf16 dtype for S aux"). An engine of another dtype now takes the profile's first row that serves
    it, with that row's environment, as a whole run of that dtype does; the run's own dtype keeps the run's row."""
    from conformance.run.fixtures import EngineFactory
    from tests.check_fakes import run_ctx

    run = run_ctx("cuda", dtype="bfloat16", devices=["NVIDIA H200"])
    options = EngineFactory(run, SimpleNamespace(path=tmp_path)).options(dtype=dtype)
    assert options.get("attention_backend") == backend and options["dtype"] == dtype
    assert options["max_model_len"] == run.target.profile.engine_options()["max_model_len"]  # the profile stays
    assert run.target.process_options("vllm") == run.target.process_options("vllm", "bfloat16")


def test_a_row_run_s_exact_twin_takes_a_row_that_serves_float32():
    """A run on the FLASH_ATTN row (bf16 only) starts its float32 twin on the first row that serves float32."""
    from tests.check_fakes import target_of

    target = target_of("cuda", dtype="bfloat16", devices=["NVIDIA H200"])
    row = target.profile.serving("bfloat16")
    assert row is target.profile
    flash = replace(target, profile=profiles.profile("h200-gpt-oss-120b", "cuda-flash-attn"))
    assert flash.process_options("vllm")["attention_backend"] == "FLASH_ATTN"
    assert flash.process_options("vllm", "float32")["attention_backend"] == "TRITON_ATTN"  # its first fp32 row
    assert flash.process_env("vllm", "float32")["TRITON_F32_DEFAULT"] == "ieee"


def _real_size_config(tmp_path):
    """A model dir whose config.json has gpt-oss-120b's dimensions (what profiles.model_key reads)."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 2880, "num_local_experts": 128}))
    return str(tmp_path)


@pytest.mark.parametrize("gate_only", [True, False])
def test_a_gate_only_run_at_real_size_captures_graphs_for_the_batches_p0_sends(gate_only, tmp_path):
    """#38: graph capture took 223 s of the 2-layer real-dimension P0's 822 s on the H200 and grows with depth. A run
    of P0 alone on a real model caps capture at profiles.toml [gate] (64 sequences) in every vLLM process it starts
    (the engine under test, the float32 twin on its row, the server), and says so in its record; P1 and up run the
    production options untouched."""
    from conformance.run import serving_fixtures
    from conformance.run.run_target import TargetReport

    report = TargetReport("cuda", "cuda", devices=["NVIDIA H200"])
    target = run_target.build("cuda", "vllm", "bfloat16", report, model=_real_size_config(tmp_path),
                              gate_only=gate_only)
    assert target.profile.name == "h200-gpt-oss-120b"
    want = {"max_cudagraph_capture_size": 64} if gate_only else None
    for options in (target.process_options("vllm"), target.process_options("vllm", "float32"),
                    serving_fixtures.new_server(target, SimpleNamespace(path=tmp_path, name="m"), tmp_path,
                                                tmp_path / "server.log").options):
        assert options.get("compilation_config") == want
        assert options["gpu_memory_utilization"] == 0.9 and options["enforce_eager"] is False
    assert target.profile.record()["gate"] == ({"compilation_config": want} if gate_only else {})


def test_the_gate_merges_into_a_profile_s_own_tables_and_leaves_the_tiny_model_alone():
    table = profiles.data() | {"gate": {"models": ["gpt-oss-120b"], "vllm": {
        "compilation_config": {"cudagraph_mode": "FULL"}, "max_num_seqs": 64}}}
    few = profiles.profile("h200-gpt-oss-120b-few-graphs").for_gate(table)
    assert few.engine_options()["compilation_config"] == {"max_cudagraph_capture_size": 64, "cudagraph_mode": "FULL"}
    assert few.engine_options()["max_num_seqs"] == 64
    tiny = profiles.profile("h200-tiny")
    assert tiny.for_gate(table) is tiny and tiny.record()["gate"] == {}


def test_the_gate_leaves_the_device_reference_room_beside_the_engine():
    """On 2026-12-05 P0 on an H100 at 16 of gpt-oss-120b's layers ran out of device memory in the fp64 reference
    and the server, beside an engine holding the profile's 0.95. A gate-only run takes at most
    [gate] gpu_memory_utilization_at_most (0.9) and records it; a share already below stays, and P1 keeps 0.95."""
    h100 = profiles.profile("h100-gpt-oss-120b")
    assert h100.engine_options()["gpu_memory_utilization"] == 0.95
    gated = h100.for_gate()
    assert gated.engine_options()["gpu_memory_utilization"] == 0.9
    assert gated.record()["gate"]["gpu_memory_utilization"] == 0.9
    h200 = profiles.profile("h200-gpt-oss-120b").for_gate()
    assert h200.engine_options()["gpu_memory_utilization"] == 0.9 and "gpu_memory_utilization" not in h200.gate
    low = profiles.data() | {"gate": profiles.data()["gate"] | {"gpu_memory_utilization_at_most": 0.5}}
    assert profiles.profile("h200-gpt-oss-120b").for_gate(low).engine_options()["gpu_memory_utilization"] == 0.5
