"""`Limits`, one per dtype (conformance/verdicts/limits.py): it carries the numbers of the data files' tables, and a
run whose dtype lacks a needed table is refused at configure, in one sentence, before any engine starts."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from conformance import datafiles
from conformance.datafiles import DataError
from conformance.verdicts import limits
from conformance.verdicts.compare import LogprobTolerance
from conformance.verdicts.limits import limits_for
from tests.test_run_options import MINI_CHECKS, run_plugin


def _toml(name: str) -> dict:
    return datafiles.load_toml(datafiles.DATA / name)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_limits_of_each_dtype_are_the_numbers_of_its_tables(dtype):
    got, tol = limits_for(dtype), _toml("tolerances.toml")
    parity, depth = tol["logprobs"][dtype], tol["depth"][dtype]
    assert got.dtype == dtype and got.logprobs == (LogprobTolerance(
        parity["max_abs"], parity.get("p99"), parity.get("median"), parity.get("stratum_median"),
        parity.get("pairwise_greedy", True), dtype if "noise_ratio" in parity else None,
        parity.get("noise_ratio"), parity.get("widen_by_band", False),
        decode_noise_depth=parity.get("decode_noise_depth")), parity["top_k"])
    assert got.depth == (LogprobTolerance(depth["max_abs"], depth.get("p99"), depth.get("median")), depth["top_k"])
    assert (got.logprobs[0].source, got.depth[0].source) == (f"tolerances.toml logprobs.{dtype}",
                                                             f"tolerances.toml depth.{dtype}")
    rule = tol["diagnosis"][dtype]
    assert (got.diagnosis.distance, got.diagnosis.ratio) == (rule["distance"], rule["ratio"])
    assert got.diagnosis.noise == {"max": parity["max_abs"], "stratum_median": parity.get("stratum_median")}[
        rule["distance"]]
    layers = tol["layers"][dtype]
    assert {b: vars(got.layers.blocks[b]) for b in ("attn", "moe")} == {b: layers[b] for b in ("attn", "moe")}
    assert got.layers.bands == tuple(tol["layers"]["bands"])
    gpt_oss = _toml("gpt_oss.toml")["tolerances"]
    assert dict(got.rope) == {k: v for k, v in gpt_oss["rope"][dtype].items() if k != "source"}
    assert (got.moe_rel, got.router_tie_ulps) == (gpt_oss["moe"][dtype], gpt_oss["moe"]["router_tie_ulps"][dtype])
    eps = {"float32": 2**-23, "bfloat16": 2**-7, "float16": 2**-10}[dtype]  # torch.finfo(dtype).eps
    assert got.layers.router_tie == got.router_tie_ulps * eps
    assert got.graph_divergences == _toml("perf.toml")["graph_mode"]["max_greedy_divergences"][dtype]
    fp8 = _toml("profiles.toml")["kv_fp8"]["tolerance"].get(dtype)
    assert got.kv_fp8 == (None if fp8 is None else
                          (LogprobTolerance(fp8["max_abs"], fp8.get("p99"), fp8.get("median")), fp8["top_k"]))
    assert ("kv_fp8" in got.missing) == (fp8 is None)


def test_the_judged_dtypes_are_those_with_logprob_limits():
    assert limits.dtypes() == list(_toml("tolerances.toml")["logprobs"])
    assert limits.refusal(None, "float32", "float32") is None and limits.refusal("bfloat16", "bfloat16", None) is None
    assert limits.refusal("bf16", "bf16", None).startswith("--dtype 'bf16' is not a dtype the suite has limits for")


def _data_without(tmp_path: Path, table: str) -> Path:
    data = tmp_path / "data"
    shutil.copytree(datafiles.DATA, data)
    text = (data / "tolerances.toml").read_text()
    cut = re.sub(rf"^\[{re.escape(table)}\]\n(?:(?!\[).*\n)*", "", text, flags=re.M)
    assert cut != text
    (data / "tolerances.toml").write_text(cut)
    return data


def test_a_dtype_without_a_table_is_refused_at_configure_in_one_sentence(tmp_path):
    """float16 with no [depth.float16]: one sentence naming the file and the table, exit 4, nothing recorded —
    not a failure of the long-context checks after their engines started."""
    data = _data_without(tmp_path, "depth.float16")
    checks = tmp_path / "checks"
    checks.mkdir()
    (checks / "test_mini.py").write_text(MINI_CHECKS)
    (checks / "conftest.py").write_text(  # loaded before the plugin configures: the suite reads this data folder
        f"from pathlib import Path\n\nfrom conformance import datafiles\n\ndatafiles.DATA = Path({str(data)!r})\n")
    proc = run_plugin(checks, "--dtype", "float16")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out[-2000:]
    assert ("tolerances.toml has no [depth.float16] table (it has bfloat16, float32): measure limits for float16 on "
            "a clean stack and add it first.") in proc.stderr
    assert "Traceback" not in out and not (tmp_path / "reports" / "runs").exists()
    assert run_plugin(checks, "--dtype", "bfloat16", "--tier", "p0").returncode == 0  # the other dtypes still run


def test_the_noise_twin_widens_each_limit_by_its_own_figure():
    """Greedy parity at depth: each limit widens to noise_ratio x the noise twin's figure of the same kind, never
    below the fixed limit; the position bands' median by the twin's largest band median."""
    tol = LogprobTolerance(8.0, 1.0, 0.05, 0.06, noise_dtype="float16", noise_ratio=3.0)
    noise = {"max_abs_dlogprob": 1.0, "p99_abs_dlogprob": 0.5, "median_abs_dlogprob": 0.01,
             "median_abs_dlogprob_decode_0-127": 0.02, "median_abs_dlogprob_prefill_256-1023": 0.03}
    wide = tol.above_noise(noise)
    assert (wide.max_abs, wide.p99, wide.median) == (8.0, 1.5, 0.05)  # 3 x 1.0 is under the fixed 8; 3 x 0.01 too
    assert wide.stratum_median == pytest.approx(0.09)  # 3 x the largest band median, 0.03
    assert wide.band_limits == ()  # without widen_by_band every band answers to the largest


def test_widening_band_by_band_holds_each_band_to_the_twin_s_same_band():
    """With widen_by_band (tolerances.toml, bf16), each band answers to noise_ratio x the twin's median in that band
    (never below the fixed stratum limit), one the twin lacks to its largest: a fault that triples one band's noise
    fails it even where the twin's largest band would have let it through (rope_bf16_inv_freq, docs/verdicts.md)."""
    from dataclasses import replace

    from conformance.verdicts import compare

    tol = LogprobTolerance(16.0, 2.0, 0.15, 0.35, noise_dtype="bfloat16", noise_ratio=3.0, widen_by_band=True)
    noise = {"max_abs_dlogprob": 8.0, "p99_abs_dlogprob": 3.8, "median_abs_dlogprob": 0.38,
             "median_abs_dlogprob_decode_256-1023": 0.36, "median_abs_dlogprob_prefill_128-255": 0.56,
             "median_abs_dlogprob_decode_0-127": 0.05}
    wide = tol.above_noise(noise)
    assert dict(wide.band_limits) == pytest.approx({"decode_256-1023": 1.08, "prefill_128-255": 1.68,
                                                    "decode_0-127": 0.35})  # 3 x 0.05 is under the fixed 0.35
    assert wide.stratum_median == pytest.approx(1.68)

    def judged(tolerance, bands):  # a report whose figures are the given band medians
        report = compare.ParityReport(tolerance, ("engine", "reference"))
        report.compared_steps = 1
        for key, value in bands.items():
            phase, band = key.split("_")
            report.strata[(phase, band)] = [value] * compare.MIN_STRATUM
        report.deltas = [0.1]
        return report.finish().problems

    fault = {"decode_256-1023": 1.23, "prefill_128-255": 0.86, "decode_0-127": 0.30}  # the H200's inv_freq fault
    assert judged(wide, fault) == ["decode positions 256-1023: median |Δlogprob| 1.23 exceeds the stratum "
                                   "tolerance 1.08"]
    assert judged(replace(tol, widen_by_band=False).above_noise(noise), fault) == []  # the largest band: blind
    healthy = {"decode_256-1023": 0.36, "prefill_128-255": 0.47, "decode_0-127": 0.33}
    assert judged(wide, healthy) == []


pytestmark = pytest.mark.slow


def test_a_dtype_without_limits_is_refused_before_the_rope_check():
    """A dtype without limits never reaches the check: its Limits is refused (at configure, tests/test_limits.py)."""
    with pytest.raises(DataError, match=r"tolerances.toml has no \[logprobs.float8_e4m3\] table"):
        limits_for("float8_e4m3")
