"""Controls of conformance/checks/test_fit.py: its own body fails a checkpoint whose headers cannot be sized with
the preflight's sentence (never a skip or a pass), and a KV cache that cannot fit the device's budget."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.checkpoints import fit
from conformance.checkpoints.models import hf_config
from conformance.checks import test_fit as fit_checks
from tests.check_fakes import FAILED, Figures, run_ctx


def test_fit_check_fails_when_the_preflight_cannot_size_the_checkpoint(monkeypatch, tmp_path):
    def gate(*args, **kwargs):
        raise fit.FitError(f"{tmp_path} has no safetensors shard to size the weights from.")
    monkeypatch.setattr(fit, "gate", gate)
    model = SimpleNamespace(path=tmp_path, config={}, name="gpt-oss-120b")
    with pytest.raises(FAILED, match="the fit preflight could not run: .* no safetensors shard"):
        fit_checks.test_serving_profile_fits_device(run_ctx().target, {"gpu_memory_utilization": 0.3}, model,
                                                    Figures())


def test_fit_check_fails_when_the_kv_cache_cannot_fit(tiny):
    """The check body on the CPU default with a config of 256 KV heads: 1024 tokens need 128 MiB of KV, more
    than the 64 MiB kv_cache_memory_bytes."""
    from types import SimpleNamespace

    from conformance.checks import test_fit as checks
    from conformance.run.fixtures import EngineFactory
    from tests.check_fakes import FAILED, Figures, run_ctx

    big = hf_config(tiny.spec) | {"num_key_value_heads": 256}
    model = SimpleNamespace(path=tiny.path, config=big, name="tiny-gpt-oss", num_params=1)
    run = run_ctx()
    options = EngineFactory(run, model).options()  # what the engine_options fixture gives the check
    with pytest.raises(FAILED, match="the KV cache does not fit: 1 request\\(s\\) of 1024 tokens need .* MiB > "
                                     "kv_cache_memory_bytes 64.0 MiB"):
        checks.test_serving_profile_fits_device(run.target, options, model, Figures())
    fits = SimpleNamespace(path=tiny.path, config=hf_config(tiny.spec), name="tiny-gpt-oss", num_params=1)
    checks.test_serving_profile_fits_device(run.target, EngineFactory(run, fits).options(), fits, Figures())
