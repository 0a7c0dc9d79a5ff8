"""Controls of the pinned serving baselines (env_checks/baselines.py, `conformance baseline promote`), run on
the P2 serving check's own body over a real SQLite history store: a drop that compounds over runs, each run
within tolerance of the one before (which the old latest-run baseline let through), fails against the pin;
a run never changes the pin nor becomes the baseline by itself; promotion takes the median of the last N
accepted runs; a damaged pin file fails in one sentence. `vllm bench serve` is replaced by its figures (the
benchmark itself is covered by tests/test_perf_controls.py)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.checks import test_serving_perf as perf_checks
from conformance.run.cli import main as cli_main
from conformance.verdicts import compare, perf
from env_checks import baselines
from reports.history import History
from tests.check_fakes import FAILED, Figures, run_ctx

FP = {"platform": {"accelerator": "none", "cpu_flags": ["avx2"]}, "packages": {"torch": "2.13.0+cpu"}}
CHECK = "conformance/checks/test_serving_perf.py::test_serving_perf_against_baseline[c8]"
SHAPE = "conformance/checks/test_serving_perf.py::test_serving_perf_at_shape[1k-8k-c8]"
MODEL = "gpt-oss-120b"
COMBO = "h200-tp1"
PROFILE = "h200-gpt-oss-120b"
# A healthy c8 sweep: throughput (higher is better) and latencies (lower is better).
HEALTHY = {"output_tok_s": 1000.0, "request_per_s": 1.0, "total_tok_s": 2000.0, "ttft_p50_ms": 100.0,
           "ttft_p99_ms": 150.0, "tpot_p50_ms": 10.0, "tpot_p99_ms": 12.0, "itl_p50_ms": 10.0, "itl_p99_ms": 14.0,
           "e2el_p50_ms": 10000.0, "e2el_p99_ms": 11000.0, "completed": 32.0, "failed": 0.0, "concurrency": 8.0}
NOW = datetime.now(timezone.utc)


def _lineage(target: str, dtype: str = "bfloat16", profile: str = PROFILE) -> str:
    """The serving lineage the check and `baseline promote` key pins on: platform, dtype and serving profile."""
    return baselines.serving_lineage(perf.lineage_of(target, FP, COMBO, "vllm"), dtype, profile)


def _stamp(hours: float) -> str:
    return (NOW + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _scaled(factor: float) -> dict[str, float]:
    """HEALTHY with throughput times `factor` and latencies over it (a stack `factor` as fast)."""
    return {k: v * factor if k.endswith("_s") and "tok" in k or k == "request_per_s" else
            v / factor if k.endswith("_ms") else v for k, v in HEALTHY.items()}


def _record(run_id: str, started: str, outcome: str, figures: dict, target: str, complete: bool = True,
            check: str = CHECK, dtype: str = "bfloat16", model: str = MODEL, **more: object) -> dict:
    summary = dict.fromkeys(("passed", "failed", "error", "skipped", "xfailed", "xpassed"), 0)
    summary[outcome] = 1
    return more | {
        "run_id": run_id, "started_at": started, "finished_at": started, "target": target, "engine": "vllm",
        "dtype": dtype, "profile": PROFILE, "combo": COMBO, "tiers": ["p2"], "complete": complete,
        "model": {"name": model, "content_hash": None}, "fingerprint": FP, "summary": summary,
        "checks": [{"id": check, "tier": "p2", "area": "performance", "outcome": outcome, "duration_s": 1.0,
                    "message": "", "reference": "", "figures": figures}]}


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real history store on disk, named to the check the way `--history-db` names it; pins beside it."""
    db = tmp_path / "reports" / "history.sqlite"
    monkeypatch.setenv(perf.HISTORY_ENV, str(db))
    monkeypatch.delenv(baselines.PINS_ENV, raising=False)
    with History.open(db):
        pass
    return db


def _ingest(db: Path, *records: dict) -> None:
    with History.open(db) as history:
        for record in records:
            history.ingest_record(record)


def _body(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, target: str, figures: dict[str, float],
          recorded: Figures, model: str = MODEL) -> None:
    """The check's own body at c8 on a run whose benchmark measured `figures` (what it says no with, raised)."""
    measured = compare.VerdictReport("vllm bench serve at concurrency 8", measured=dict(figures))
    monkeypatch.setattr(perf, "run_bench", lambda *args, **kwargs: measured)
    run = run_ctx(target, run_dir=tmp_path)
    run.combo = COMBO
    server = SimpleNamespace(client=SimpleNamespace(base_url="http://127.0.0.1:9"), model=model, api_key=None,
                             managed=False)
    perf_checks.test_serving_perf_against_baseline(8, run.target, run.run_dir, server, tmp_path,
                                                   SimpleNamespace(name=model), _lineage(target), recorded,
                                                   SimpleNamespace(node=SimpleNamespace(nodeid=CHECK)))


def _run_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, target: str, figures: dict[str, float],
               model: str = MODEL) -> tuple[str, str, Figures]:
    """The check's own body at c8 on a run whose benchmark measured `figures`: (outcome, message, figures)."""
    recorded = Figures()
    try:
        _body(monkeypatch, tmp_path, target, figures, recorded, model)
    except FAILED as exc:
        return "failed", str(exc), recorded
    except pytest.skip.Exception as exc:
        return "skipped", str(exc), recorded
    return "passed", "", recorded


def _promote(db: Path, target: str, *extra: str, dtype: str = "bfloat16", model: str = MODEL) -> int:
    return cli_main(["baseline", "promote", "--db", str(db), "--lineage", _lineage(target, dtype),
                     "--model", model, *extra])


@pytest.mark.parametrize(("target", "step", "steps", "first_failing"), [
    ("cuda", 0.91, 15, 2),  # 9 % slower per run, 4x over 15 runs: the pin's 10 % catches the second
    ("cpu", 0.5, 3, 3),     # the CPU's wide noise band (data/perf.toml): half as fast per run, 8x over 3
], ids=["cuda-4x-over-15-runs", "cpu-8x-over-3-runs"])
def test_a_drop_that_compounds_over_runs_fails_against_the_pin(store, tmp_path, monkeypatch, target, step, steps,
                                                               first_failing):
    _ingest(store, *(_record(f"accepted-{i}", _stamp(-10 + i), "passed", _scaled(f), target)
                     for i, f in enumerate((0.98, 1.0, 1.02))))
    assert _promote(store, target) == 0
    pins = baselines.pins_path(store)
    pinned = pins.read_bytes()
    limits = perf.regression_limits(target)
    previous = _scaled(1.0)
    outcomes = []
    for n in range(1, steps + 1):
        figures = _scaled(step ** n)
        # the old baseline, the latest run, lets every step through: the ratchet this pin replaces
        assert perf.regression_verdict(figures, perf.Baseline("prev", "", previous), limits).ok
        outcome, message, recorded = _run_check(monkeypatch, tmp_path, target, figures)
        outcomes.append(outcome)
        _ingest(store, _record(f"run-{n}", _stamp(n), outcome, recorded.values, target))
        previous = figures
        assert pins.read_bytes() == pinned, "a run changed the pinned baseline"
    assert outcomes == ["passed"] * (first_failing - 1) + ["failed"] * (steps - first_failing + 1), outcomes
    assert "output_tok_s regressed" in message and "pinned baseline promoted" in message
    assert "accepted-0, accepted-1, accepted-2" in message
    assert f"output_tok_s: {1000 * step ** steps:.4g} vs pinned 1000 (must be >= " in message
    assert f"; since the pin: {1000 * step:.4g} -> " in message and f"over {steps} run(s)" in message
    assert f"itl_p99_ms: {14 / step ** steps:.4g} vs pinned 14" in message or target == "cpu"  # every figure shown
    assert recorded.values["output_tok_s_vs_pinned"] == pytest.approx(step ** steps)
    assert recorded.values["output_tok_s_drift_since_pin"] == pytest.approx(step ** (steps - 1))
    assert recorded.values["runs_since_pin"] == steps
    assert step ** steps <= 0.25


def test_the_tiny_model_on_a_gpu_is_judged_for_a_collapse_not_for_its_hosts_swings(store, tmp_path, monkeypatch):
    """The tiny model served on a GPU is host-bound (perf.toml [serving_host_bound]): the check's own body lets
    through the swing one H100 node showed between P2 runs of one stack (round twenty-seven: 0.70x the pinned
    output throughput, 1.77x its TTFT p50), which fails the real model; a collapse to 0.4x fails both."""
    swing = dict(HEALTHY, output_tok_s=700.0, ttft_p50_ms=177.0, tpot_p50_ms=13.0, itl_p50_ms=13.0,
                 ttft_p99_ms=400.0, itl_p99_ms=40.0)
    collapse = _scaled(0.4)
    outcomes = {}
    for model in ("tiny-gpt-oss", MODEL):
        _ingest(store, *(_record(f"{model}-{i}", _stamp(-10 + i), "passed", _scaled(f), "cuda", model=model)
                         for i, f in enumerate((0.98, 1.0, 1.02))))
        assert _promote(store, "cuda", model=model) == 0
        outcomes[model] = [_run_check(monkeypatch, tmp_path, "cuda", figures, model)[:2]
                           for figures in (swing, collapse)]
    (tiny_swing, tiny_collapse), (real_swing, real_collapse) = outcomes["tiny-gpt-oss"], outcomes[MODEL]
    assert tiny_swing == ("passed", ""), tiny_swing
    assert real_swing[0] == "failed" and "ttft_p50_ms regressed to 177" in real_swing[1]
    for outcome, message in (tiny_collapse, real_collapse):
        assert outcome == "failed" and "output_tok_s regressed to 400" in message, message
    assert "tolerance 50%" in tiny_collapse[1] and "tolerance 10%" in real_collapse[1]


def test_a_run_never_becomes_the_baseline_by_itself(store, tmp_path, monkeypatch):
    """Accepted runs in the history store but nothing pinned: the check goes to the floors (none for this
    combination: it skips saying so), not to the latest run; after a pin, passing runs leave it alone."""
    _ingest(store, _record("good", _stamp(-5), "passed", _scaled(1.0), "cpu"))
    outcome, message, _ = _run_check(monkeypatch, tmp_path, "cpu", _scaled(0.01))
    assert outcome == "skipped" and "no pinned baseline for lineage" in message and "no absolute floor" in message
    assert "conformance baseline promote" in message
    assert _promote(store, "cpu", "--runs", "1") == 0
    before = baselines.load(baselines.pins_path(store)).get(CHECK, _lineage("cpu"), MODEL)
    for n, factor in enumerate((0.9, 0.8, 0.7), start=1):
        outcome, _, recorded = _run_check(monkeypatch, tmp_path, "cpu", _scaled(factor))
        assert outcome == "passed"
        _ingest(store, _record(f"later-{n}", _stamp(n), outcome, recorded.values, "cpu"))
    after = baselines.load(baselines.pins_path(store)).get(CHECK, _lineage("cpu"), MODEL)
    assert after == before and after.figures["output_tok_s"] == 1000.0
    assert recorded.values["output_tok_s_vs_pinned"] == pytest.approx(0.7)


def test_promotion_takes_the_median_of_the_last_accepted_runs(store, capsys):
    lineage = _lineage("cuda")
    tok = (900.0, 1000.0, 1100.0, 5000.0, 1050.0)
    _ingest(store, *(_record(f"ok-{i}", _stamp(-20 + i), "passed" if i else "skipped",
                             HEALTHY | {"output_tok_s": t, "output_tok_s_vs_pinned": 9.0}, "cuda")
                     for i, t in enumerate(tok)),
            _record("regressed", _stamp(-10), "failed", HEALTHY | {"output_tok_s": 10.0}, "cuda"),
            _record("cut-short", _stamp(-9), "passed", HEALTHY | {"output_tok_s": 20.0}, "cuda", complete=False),
            _record("long-output", _stamp(-8), "passed", HEALTHY | {"output_tok_s": 400.0}, "cuda", check=SHAPE))
    assert _promote(store, "cuda", "--runs", "3", "--note", "after the driver update") == 0
    assert f"not pinned {SHAPE}: only 1 accepted run(s), fewer than --runs 3" in capsys.readouterr().out
    assert baselines.load(baselines.pins_path(store)).get(SHAPE, lineage, MODEL) is None
    pin = baselines.load(baselines.pins_path(store)).get(CHECK, lineage, MODEL)
    assert pin.figures["output_tok_s"] == 1100.0  # median of 1100, 5000, 1050: the outlier does not move it
    assert [r.run_id for r in pin.runs] == ["ok-2", "ok-3", "ok-4"] and pin.note == "after the driver update"
    assert "output_tok_s_vs_pinned" not in pin.figures  # a derived figure is never pinned
    assert _stamp(-1) <= pin.promoted_at <= _stamp(1)
    assert _promote(store, "cuda", "--runs", "1", "--check", SHAPE) == 0
    assert _promote(store, "cuda", "--runs", "5", "--check", CHECK) == 0
    pin = baselines.load(baselines.pins_path(store)).get(CHECK, lineage, MODEL)
    assert pin.figures["output_tok_s"] == 1050.0 and len(pin.runs) == 5
    assert "replacing the pin of" in capsys.readouterr().out
    assert baselines.load(baselines.pins_path(store)).get(SHAPE, lineage, MODEL).figures["output_tok_s"] == 400.0
    with pytest.raises(SystemExit, match=r"only 5 accepted run\(s\) .* fewer than --runs 6"):
        _promote(store, "cuda", "--runs", "6", "--check", CHECK)
    with pytest.raises(SystemExit, match="nothing to promote"):
        cli_main(["baseline", "promote", "--db", str(store), "--lineage", "rocm gfx942 · vllm · other",
                  "--model", MODEL])
    assert cli_main(["baseline", "list", "--db", str(store)]) == 0
    assert f"--lineage {lineage!r} --model {MODEL!r}: 5 accepted run(s); pinned baseline promoted" in \
        capsys.readouterr().out


def test_a_pin_takes_only_evidence_of_its_own_dtype_and_serving_profile(store, capsys):
    """Like with like: a bf16 pin is the median of bf16 runs on the same serving profile, never of an fp16 run (another
    attention backend, other kernels) nor of a narrowed run (not a platform result); `baseline list` names each
    serving lineage apart, and the fp16 one gets its own pin."""
    _ingest(store, _record("bf16", _stamp(-5), "skipped", HEALTHY, "cuda"),
            _record("fp16", _stamp(-4), "skipped", _scaled(2.0), "cuda", dtype="float16"),
            _record("narrowed", _stamp(-3), "passed", _scaled(3.0), "cuda", narrowed_by="-k c8", evidence=False))
    assert _promote(store, "cuda", "--runs", "1") == 0
    pins = baselines.load(baselines.pins_path(store))
    assert [r.run_id for r in pins.get(CHECK, _lineage("cuda"), MODEL).runs] == ["bf16"]
    assert pins.get(CHECK, _lineage("cuda", "float16"), MODEL) is None
    assert _promote(store, "cuda", "--runs", "1", dtype="float16") == 0
    pin = baselines.load(baselines.pins_path(store)).get(CHECK, _lineage("cuda", "float16"), MODEL)
    assert [r.run_id for r in pin.runs] == ["fp16"] and pin.figures["output_tok_s"] == 2000.0
    capsys.readouterr()
    assert cli_main(["baseline", "list", "--db", str(store)]) == 0
    listed = capsys.readouterr().out
    assert f"--lineage {_lineage('cuda')!r}" in listed and f"--lineage {_lineage('cuda', 'float16')!r}" in listed


def test_a_run_measured_during_a_kernel_compile_is_never_pinned(store, capsys):
    """vLLM's server logged a Triton JIT compile during the H200's c8 run (TTFT p99 1669 ms, p50 47 ms): that run's
    latencies are the compiler's. Promotion leaves it out, says why when nothing else is left, and pins the rest."""
    lineage = _lineage("cuda")
    compiled = HEALTHY | {"ttft_p99_ms": 1669.0, baselines.JIT_FIGURE: 1.0}
    _ingest(store, _record("clean", _stamp(-3), "skipped", HEALTHY | {baselines.JIT_FIGURE: 0.0}, "cuda", check=SHAPE),
            _record("compiled", _stamp(-2), "skipped", compiled, "cuda"))
    assert _promote(store, "cuda", "--runs", "1") == 0
    out = capsys.readouterr().out
    assert f"left out compiled of {CHECK}: a kernel compiled while it was measured (jit_compiles_during_run 1)" in out
    assert f"not pinned {CHECK}: each of its runs was left out" in out
    pins = baselines.load(baselines.pins_path(store))
    assert pins.get(CHECK, lineage, MODEL) is None and pins.get(SHAPE, lineage, MODEL) is not None
    _ingest(store, _record("clean-later", _stamp(-1), "skipped", HEALTHY | {baselines.JIT_FIGURE: 0.0}, "cuda"))
    assert _promote(store, "cuda", "--runs", "1", "--check", CHECK) == 0
    pin = baselines.load(baselines.pins_path(store)).get(CHECK, lineage, MODEL)
    assert [r.run_id for r in pin.runs] == ["clean-later"] and pin.figures["ttft_p99_ms"] == 150.0


def test_a_run_measured_on_a_shared_gpu_is_never_pinned_even_when_named(store, capsys):
    """A P2 run whose GPU another job held: its levels record the other processes on the GPU
    (`gpu_foreign_processes`); promotion leaves such a measurement out, by either route, and says so."""
    shared = HEALTHY | {baselines.SHARED_FIGURE: 1.0}
    _ingest(store, _record("shared", _stamp(-2), "failed", shared, "cuda"),
            _record("alone", _stamp(-1), "passed", HEALTHY | {baselines.SHARED_FIGURE: 0.0}, "cuda"))
    with pytest.raises(SystemExit, match=r"nothing to promote for .*: left out shared of .*: another process held "
                                         r"the GPU while it was measured \(gpu_foreign_processes 1\)\.$"):
        _promote(store, "cuda", "--run", "shared")
    with pytest.raises(SystemExit, match=r"fewer than the 2 named with --run; left out shared of "):
        _promote(store, "cuda", "--run", "shared", "--run", "alone")
    assert _promote(store, "cuda", "--runs", "1") == 0
    pin = baselines.load(baselines.pins_path(store)).get(CHECK, _lineage("cuda"), MODEL)
    assert [r.run_id for r in pin.runs] == ["alone"]


def test_a_pin_from_named_runs_keeps_their_spread_and_the_check_allows_no_more(store, tmp_path, monkeypatch):
    """The H200's two P2 runs of one stack lay 23% apart in output tok/s at c1 (683 and 524; GPU clocks steady): the
    second failed against a pin of the first alone. Promoted from both by name (`--run`, whatever the outcome), the
    pin keeps each figure's spread, and the check's own body allows that spread instead of perf.toml's 10%, no more:
    a run like the slower one passes, one beyond the spread fails. A named run whose requests failed is never pinned,
    and a spread wider than perf.toml's cap widens no further than the cap."""
    lineage = _lineage("cuda")
    _ingest(store, _record("first", _stamp(-3), "passed", _scaled(1.0), "cuda"),
            _record("second", _stamp(-2), "failed", _scaled(0.77), "cuda"),
            _record("broken", _stamp(-1), "passed", _scaled(0.5) | {"failed": 3.0}, "cuda"))
    assert _promote(store, "cuda", "--run", "first") == 0
    assert _run_check(monkeypatch, tmp_path, "cuda", _scaled(0.77))[0] == "failed"  # one run: 10% holds
    with pytest.raises(SystemExit, match=r"only 2 accepted run\(s\) .* fewer than the 3 named with --run; left out "
                       r"broken of .*: 3 of its requests failed: run again"):
        _promote(store, "cuda", "--run", "first", "--run", "second", "--run", "broken")
    assert _promote(store, "cuda", "--run", "first", "--run", "second") == 0
    pin = baselines.load(baselines.pins_path(store)).get(CHECK, lineage, MODEL)
    assert [r.run_id for r in pin.runs] == ["first", "second"]
    assert pin.spread["output_tok_s"] == pytest.approx(230 / 885)
    assert pin.spread["completed"] == 0.0
    outcome, message, _ = _run_check(monkeypatch, tmp_path, "cuda", _scaled(0.70))
    assert outcome == "passed", message
    outcome, message, _ = _run_check(monkeypatch, tmp_path, "cuda", _scaled(0.60))
    assert outcome == "failed" and "output_tok_s regressed to 600 from 885" in message
    assert "tolerance 26% (the spread of the pinned runs)" in message
    wide = perf.Baseline("p", "", {"output_tok_s": 1000.0, "ttft_p99_ms": 100.0}, "pinned",
                         {"output_tok_s": 1.4, "ttft_p99_ms": 1.6})
    limits = [perf.FigureLimit("output_tok_s", "higher", 0.10), perf.FigureLimit("ttft_p99_ms", "lower", 0.35)]
    assert (perf.spread_cap("higher"), perf.spread_cap("lower")) == (0.5, 1.0)
    assert perf.regression_verdict({"output_tok_s": 510.0, "ttft_p99_ms": 199.0}, wide, limits).ok
    assert not perf.regression_verdict({"output_tok_s": 490.0, "ttft_p99_ms": 199.0}, wide, limits).ok
    assert not perf.regression_verdict({"output_tok_s": 510.0, "ttft_p99_ms": 201.0}, wide, limits).ok


def test_a_pin_of_another_request_count_fails_the_level_as_unlike(store, tmp_path, monkeypatch):
    """perf.toml's GPU mix went from four waves per level to one (8 requests at c1 became 4, 32 at c8 became 8): a pin
    of the old mix is not compared with a run of the new one. The check's own body fails the level at the very
    throughput and latencies of its pin as `unlike_pin` (not like for like, not the stack's failure), saying how many
    requests each measured; a pin of the same count passes."""
    from conformance.run import runrecord
    _ingest(store, _record("four-waves", _stamp(-3), "passed", _scaled(1.0), "cuda"))
    assert _promote(store, "cuda", "--runs", "1") == 0
    one_wave = _scaled(1.0) | {"completed": 8.0}
    with pytest.raises(perf.UnlikePin) as failure:
        _body(monkeypatch, tmp_path, "cuda", one_wave, Figures())
    message = str(failure.value)
    assert "the baseline measured 32 requests at this level and this run 8: not like with like" in message
    assert "regressed" not in message
    assert runrecord.classify("failed", message, runrecord.exception_chain(failure.value)) == "unlike_pin"
    _ingest(store, _record("one-wave", _stamp(-1), "failed", one_wave, "cuda"))
    assert _promote(store, "cuda", "--run", "one-wave") == 0
    assert _run_check(monkeypatch, tmp_path, "cuda", one_wave)[0] == "passed"


@pytest.mark.parametrize(("body", "why"), [
    ("{not json", "not readable JSON"),
    (json.dumps({"schema": 2, "baselines": [{"check_id": CHECK, "lineage": "x", "model": MODEL,
                                             "promoted_at": "2026-11-01T00:00:00Z", "figures": {"output_tok_s": "NaN"},
                                             "runs": [{"run_id": "a"}]}]}), "non-finite or non-numeric figures"),
    (json.dumps({"baselines": {}}), "not a schema-2 object"),
    (json.dumps({"schema": 1, "baselines": []}), "of schema 1, keyed by the platform lineage alone"),
    (None, "has no ttft_p50_ms, tpot_p50_ms, which perf.toml judges"),
], ids=["garbage", "nan-figure", "wrong-shape", "schema-1", "pin-lacks-a-judged-figure"])
def test_a_damaged_pin_file_fails_the_check_in_one_sentence(store, tmp_path, monkeypatch, body, why):
    pins = baselines.pins_path(store)
    if body is None:  # a pin whose runs measured only throughput
        _ingest(store, _record("thin", _stamp(-1), "passed", {"output_tok_s": 1000.0}, "cpu"))
        assert _promote(store, "cpu", "--runs", "1") == 0
    else:
        pins.write_text(body)
    outcome, message, _ = _run_check(monkeypatch, tmp_path, "cpu", _scaled(1.0))
    assert outcome == "failed" and why in message and str(pins) in message, message
    assert "\n" not in message and "Traceback" not in message and message.count(". ") == 0, message
    if body is not None:
        with pytest.raises(SystemExit, match="is unusable"):  # promotion refuses to write over it
            _promote(store, "cpu")


@pytest.mark.parametrize(("figure", "pinned_host", "expect"), [
    # the pins' host ran the probe far faster than any real core: this host is slower
    (baselines.HOST_FIGURE, 1000.0, "slower_host"),
    ("host_copy_gbs", 1e5, "slower_host"),  # its memcpy far faster than any real host's: slower by the copy probe
    (baselines.HOST_FIGURE, 0.001, "new_failure"),  # the pins' host was the slower one: the miss is the stack's
    (None, None, "new_failure"),  # pins of runs that measured no host speed: the miss is the stack's, and it says so
], ids=["pinned-on-a-faster-host", "pinned-on-a-host-that-copies-faster", "pinned-on-a-slower-host",
        "pin-without-host-speed"])
def test_a_level_missed_against_a_pin_from_a_faster_host_fails_as_slower_host(store, tmp_path, monkeypatch, capsys,
                                                                            figure, pinned_host, expect):
    """The check's own body probes this host's single-thread and memory-copy speeds as the level starts and records
    them. Against pins of runs whose host ran either probe more than perf.toml's [host_speed] tolerance faster, a
    level at half the pinned throughput fails as `slower_host`, naming the probe and the ratio (not like for like);
    against pins from a slower host, or pins with no host speed, it fails as the stack's regression. A level that
    meets its pin passes either way."""
    from conformance.run import runrecord
    from conformance.verdicts.verdict import CheckFailed

    hosts = [{} if pinned_host is None else {figure: pinned_host * f} for f in (0.95, 1.0, 1.05)]
    _ingest(store, *(_record(f"pinned-{i}", _stamp(-10 + i), "passed", _scaled(f) | hosts[i], "cuda")
                     for i, f in enumerate((0.98, 1.0, 1.02))))
    assert _promote(store, "cuda") == 0
    said = "its runs' hosts lay 10% apart in single-thread speed"  # what promotion says of the pin it wrote
    assert (said in capsys.readouterr().out) == (figure == baselines.HOST_FIGURE)

    def level(figures: dict[str, float]) -> tuple[CheckFailed | None, Figures]:
        recorded = Figures()
        try:
            _body(monkeypatch, tmp_path, "cuda", figures, recorded)
        except CheckFailed as exc:
            return exc, recorded
        return None, recorded

    failure, recorded = level(_scaled(0.5))
    assert failure is not None and "output_tok_s regressed to 500 from 1000" in str(failure)
    assert recorded.values[baselines.HOST_FIGURE] > 0.01 and recorded.values["host_copy_gbs"] > 0.5  # this host's
    assert set(baselines.HOST_FIGURES) <= set(recorded.values)  # every host figure a pin can judge by is recorded
    assert runrecord.classify("failed", str(failure), runrecord.exception_chain(failure)) == expect
    if expect == "slower_host" and figure == baselines.HOST_FIGURE:
        assert re.search(r"this host ran the suite's single-thread probe at 0\.0\d+ of the speed of the pinned runs' "
                         r"host \([0-9.]+ against 1e\+03 million steps a second\)", str(failure)), str(failure)
    elif expect == "slower_host":
        assert re.search(r"this host ran the suite's memory-copy probe at 0\.00 of the speed of the pinned runs' "
                         r"host \([0-9.]+ against 1e\+05 GB a second\)", str(failure)), str(failure)
    else:
        assert "probe at" not in str(failure)
        assert ("the pinned runs measured no host speed" in str(failure)) == (pinned_host is None)
    failure, recorded = level(_scaled(1.0))
    assert failure is None and recorded.values["output_tok_s_vs_pinned"] == pytest.approx(1.0)
