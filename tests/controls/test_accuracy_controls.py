"""Controls of conformance/checks/test_accuracy.py: its own body fails on a model directory without a readable
config."""

from __future__ import annotations

from tests.check_fakes import Figures, fails


def test_accuracy_check_fails_on_a_model_dir_without_a_readable_config(tmp_path):
    from conformance.checks import test_accuracy as accuracy_checks
    from tests.check_fakes import run_ctx

    (tmp_path / "config.json").write_text("{not json")
    run = run_ctx(model_arg=str(tmp_path))
    fails(accuracy_checks.test_accuracy_meets_published_figure, "gsm8k", "low", run.target, run.run_dir, 10,
          Figures(), None,
          match="cannot be read as JSON")
