"""Negative control that runs the fit preflight check's own body (conformance/checks/test_fit.py): a checkpoint
whose headers cannot be sized fails the check with the preflight's sentence, never a skip or a pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.checks import test_fit as fit_checks
from conformance.run import fit
from tests.check_fakes import FAILED, Figures, run_ctx


def test_fit_check_fails_when_the_preflight_cannot_size_the_checkpoint(monkeypatch, tmp_path):
    def gate(*args, **kwargs):
        raise fit.FitError(f"{tmp_path} has no safetensors shard to size the weights from.")
    monkeypatch.setattr(fit, "gate", gate)
    model = SimpleNamespace(path=tmp_path, config={}, name="gpt-oss-120b")
    with pytest.raises(FAILED, match="the fit preflight could not run: .* no safetensors shard"):
        fit_checks.test_serving_profile_fits_device(run_ctx().target, {"gpu_memory_utilization": 0.3}, model,
                                                    Figures())
