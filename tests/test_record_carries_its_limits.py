"""A kept run reads later exactly as it was judged: each check records the limit every judged figure was held to
(`checks[].limits`, through `record_figures` and the verdicts' `limits()`), and the run records the suite that judged
it (`suite`: version, commit, a hash of the data tables)."""

from __future__ import annotations

import shutil

from conformance import datafiles
from conformance.checks import test_model_math as math_checks
from conformance.run import recorder
from conformance.verdicts.compare import LogprobTolerance, ParityReport, over_limits
from conformance.verdicts.limits import limits_for
from conformance.verdicts.verdict import FigureLimit, at_least, record_figures
from tests.check_fakes import Figures, ScriptedEngine


def _report(tol: LogprobTolerance, deltas: list[float]) -> ParityReport:
    report = ParityReport(tol, ("engine", "reference"), deltas=deltas, compared_steps=len(deltas))
    report.add_stratum(("decode", "0-127"), deltas)
    return report


def test_a_parity_report_names_the_limits_that_judged_it_widened_or_not():
    table = LogprobTolerance(0.1, p99=0.05, median=0.01, stratum_median=0.02)
    report = _report(table, [0.001] * 40)
    limits = report.limits()
    assert {k: v.value for k, v in limits.items()} == {"max_abs_dlogprob": 0.1, "p99_abs_dlogprob": 0.05,
                                                      "median_abs_dlogprob": 0.01,
                                                      "median_abs_dlogprob_decode_0-127": 0.02}
    assert all(v.kind == "max" and "widened" not in v.source for v in limits.values())
    noisy = LogprobTolerance(0.1, 0.05, 0.01, 0.02, noise_dtype="bfloat16", noise_ratio=2.0)
    wide = _report(noisy.above_noise({"max_abs_dlogprob": 1.0, "p99_abs_dlogprob": 0.5, "median_abs_dlogprob": 0.2,
                                      "median_abs_dlogprob_decode_0-127": 0.3}), [0.001] * 40)
    assert wide.limits()["max_abs_dlogprob"].value == 2.0 and "widened" in wide.limits()["max_abs_dlogprob"].source


def test_the_recorded_limits_are_the_ones_that_failed_a_figure():
    """The control: a figure over its recorded limit is exactly a figure the verdict failed on."""
    report = _report(LogprobTolerance(0.1, p99=0.05, median=0.01, stratum_median=0.02), [0.5] * 40)
    failed = over_limits(report.figures(), report.tolerance)
    over = [k for k, v in report.limits().items() if not report.figures()[k] <= v.value]
    assert len(failed) == len(over) == 4


def test_record_figures_records_each_verdicts_limits_through_the_fixture():
    figures = Figures()
    verdict = at_least(90.0, 100.0, "below", "tflops_bf16", "devices.toml X floor_tflops.bfloat16")
    record_figures(figures, verdict)
    assert figures.limits == {"tflops_bf16": FigureLimit(100.0, "min", "devices.toml X floor_tflops.bfloat16")}
    record_figures(lambda name, value: None, verdict)  # a recorder without `limit` records the figures alone


def test_a_check_body_records_the_limits_it_judged_by(tiny, reference):
    """The RoPE check on a healthy engine: each judged figure of the record has its limit, from the dtype's table."""
    engine = ScriptedEngine({"components:rope_tables": reference.rope_tables})
    figures = Figures()
    math_checks.test_rope_tables_match_reference(engine, reference, limits_for("float32"), 1.0, figures)
    rope = limits_for("float32").rope
    assert figures.limits["rope_concentration_abs_err"].value == rope["concentration_abs"]
    assert figures.limits["rope_inv_freq_max_rel_err"].value == rope["inv_freq_rel"]
    assert set(figures.limits) <= set(figures.values)


def test_the_run_names_the_suite_and_the_data_that_judged_it(tmp_path, monkeypatch):
    identity = recorder.suite_identity()
    assert identity["version"] and len(identity["data_hash"]) == 64
    assert identity["commit"] is None or len(identity["commit"].removesuffix("+dirty")) == 40
    copy = tmp_path / "data"
    shutil.copytree(datafiles.DATA, copy)
    monkeypatch.setattr(datafiles, "DATA", copy)
    assert recorder.suite_identity()["data_hash"] == identity["data_hash"]  # the same tables, the same hash
    table = copy / "tolerances.toml"
    table.write_text(table.read_text() + "\n# a limit changed\n")
    assert recorder.suite_identity()["data_hash"] != identity["data_hash"]
