"""The fit preflight of the run's serving profile (the same gate the engines fixture applies first)."""

import pytest

from conformance.checkpoints import fit
from conformance.verdicts.verdict import fail, record_figures

AREA = "engine"


@pytest.mark.p0
@pytest.mark.needs("memory_budget")
def test_serving_profile_fits_device(target, engine_options, model_under_test, record_figure):
    """The serving profile's configuration fits the device before any engine starts: the checkpoint's
    weights (sized from its safetensors headers) per GPU at the profile's tensor-parallel size, plus the KV
    cache of its required requests (one at max_model_len, the P2 sweep's largest load; sliding layers hold
    only their window), plus overhead, within gpu_memory_utilization x device memory. On the CPU default:
    the KV requirement within kv_cache_memory_bytes.

    Catches: a profile that cannot hold its model (gpt-oss-120b at gpu_memory_utilization 0.3 on one
    MI300X: 58 GB for ~65 GB of weights), a max_model_len or concurrency whose KV cache exceeds what is
    left — failures that otherwise surface as an out-of-memory error minutes into engine start-up.
    Reference: https://docs.vllm.ai/en/latest/configuration/conserving_memory.html;
      https://github.com/huggingface/safetensors (header format)
    Controls: tests/controls/test_fit_controls.py::test_fit_check_fails_when_the_preflight_cannot_size_the_checkpoint
    """
    try:
        verdict = fit.gate(target, model_under_test.path, model_under_test.config, engine_options,
                           model_under_test.name)
    except fit.FitError as exc:
        fail(f"the fit preflight could not run: {exc}")
    record_figures(record_figure, verdict)
    if not verdict.ok:
        fail(f"profile {target.profile.label}: {verdict.sentence}")

