"""The P3 accuracy plumbing, offline: the pass-mark rule and the published figures as data, model
identification, lm-eval's results and samples files parsed (a recorded run in fixtures/eval), and —
slow — lm-eval run for real against vLLM serving the tiny model on the small gsm8k-format set in
fixtures/eval: its score is parsed and judged, a threshold above the achieved score fails, and a server
that ignores the reasoning effort is caught. The tiny model's scores mean nothing; the machinery does."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conformance import datafiles
from conformance.engines import server_fork
from conformance.engines.vllm_server import ServerClient
from conformance.run import run_target
from conformance.verdicts import accuracy
from conformance.verdicts.compare import CheckFailed

EVAL = Path(__file__).resolve().parent.parent / "fixtures" / "eval"
RECORDED = EVAL / "lm_eval_output"
G120 = {"model_type": "gpt_oss", "num_hidden_layers": 36, "num_local_experts": 128, "hidden_size": 2880}
G20 = {"model_type": "gpt_oss", "num_hidden_layers": 24, "num_local_experts": 32}


def _tiny_data(max_gen_toks: int = 8) -> dict:
    """accuracy.toml with answers cut to a few tokens and few concurrent requests (2 CPU cores)."""
    data = datafiles.load_toml(accuracy.ACCURACY_DATA)
    data["tasks"]["gsm8k"]["gen_kwargs"] = {"max_gen_toks": max_gen_toks}
    data["lm_eval"] |= {"num_concurrent": 4, "run_timeout_s": 300}
    return data


def test_pass_rule_is_explicit_data():
    rule = accuracy.pass_rule()
    assert rule.kind == "margin" and rule.pass_mark(0.794) == pytest.approx(0.744)
    assert "reference - 0.05" in rule.describe()
    mlperf = accuracy.PassRule("ratio", 0.0, 0.99)
    assert mlperf.pass_mark(0.925) == pytest.approx(0.91575) and "99%" in mlperf.describe()
    bad = datafiles.load_toml(accuracy.ACCURACY_DATA)
    bad["rule"]["kind"] = "vibes"
    with pytest.raises(datafiles.DataError, match="margin"):
        accuracy.pass_rule(bad)


def test_published_figures_per_model_task_and_effort():
    gpqa = accuracy.reference_figure("gpt-oss-120b", "gpqa_diamond", "high")
    assert gpqa.value == 0.794 and "vLLM" in gpqa.source
    assert accuracy.reference_figure("gpt-oss-120b", "aime25", "low").value == 0.504
    assert accuracy.reference_figure("gpt-oss-20b", "gpqa_diamond", "low").value == 0.568
    assert accuracy.reference_figure("gpt-oss-20b", "aime25", "high") is None
    assert ("gsm8k", "medium") in accuracy.cases() and ("gpqa_diamond", "high") in accuracy.cases()


def test_model_identified_by_config_then_by_served_name():
    assert accuracy.identify_model(G120, None) == "gpt-oss-120b"
    assert accuracy.identify_model(G20, "whatever") == "gpt-oss-20b"
    assert accuracy.identify_model({"model_type": "gpt_oss", "num_hidden_layers": 2}, "gpt-oss-120b") is None
    assert accuracy.identify_model(None, "openai/gpt-oss-120b") == "gpt-oss-120b"
    assert accuracy.identify_model(None, "tiny-gpt-oss-o200k") is None


def test_missing_dataset_files_are_named(tmp_path: Path):
    task = accuracy.tasks()["gsm8k"]
    files, missing = accuracy.resolve_files(task, tmp_path)
    assert not files and len(missing) == 2 and "gsm8k/test.jsonl" in missing[0]
    files, missing = accuracy.resolve_files(task, EVAL)
    assert not missing and files["test"].name == "test.jsonl" and files["train"].name == "train.jsonl"


def test_task_config_derives_from_lm_evals_own(tmp_path: Path):
    task = accuracy.tasks()["gsm8k"]
    files, _ = accuracy.resolve_files(task, EVAL)
    name = accuracy.write_task_config(task, files, tmp_path)
    config = json.loads((tmp_path / f"{name}.yaml").read_text())
    assert name == "conformance_gsm8k" and config["include"].endswith("tasks/gsm8k/gsm8k.yaml")
    assert Path(config["include"]).is_file() and config["dataset_path"] == "json"
    assert config["dataset_kwargs"]["data_files"]["test"] == str(files["test"])
    for other in ("gpqa_diamond", "aime25"):  # every shipped base config exists in the pinned lm-eval
        assert (accuracy.lm_eval_tasks_dir() / accuracy.tasks()[other].base).is_file()


def test_recorded_lm_eval_output_parses():
    score = accuracy.parse_lm_eval_results(RECORDED, "conformance_gsm8k", "exact_match,flexible-extract")
    assert (score.score, score.stderr, score.samples, score.answered) == (0.75, 0.25, 4, 4)
    assert score.efforts_sent == {"high"}
    strict = accuracy.parse_lm_eval_results(RECORDED, "conformance_gsm8k", "exact_match,strict-match")
    assert strict.score == 0.5
    with pytest.raises(accuracy.AccuracyError, match="no 'exact_match,none'"):
        accuracy.parse_lm_eval_results(RECORDED, "conformance_gsm8k", "exact_match,none")
    with pytest.raises(accuracy.AccuracyError, match="no results for"):
        accuracy.parse_lm_eval_results(RECORDED, "conformance_aime25", "exact_match,none")


def test_verdict_fails_below_the_pass_mark_and_on_the_wrong_effort():
    score = accuracy.parse_lm_eval_results(RECORDED, "conformance_gsm8k", "exact_match,flexible-extract")
    rule = accuracy.pass_rule()
    ok = accuracy.accuracy_verdict(score, accuracy.Reference("m", "gsm8k", "high", 0.794, "s"), rule)
    assert ok.ok and ok.figures()["pass_mark"] == pytest.approx(0.744)
    low = accuracy.accuracy_verdict(score, accuracy.Reference("m", "gsm8k", "high", 0.925, "card"), rule)
    assert not low.ok and "below the pass mark 0.8750" in low.problems[0]
    with pytest.raises(CheckFailed, match="card"):
        low.raise_if_failed()
    other = accuracy.accuracy_verdict(score, accuracy.Reference("m", "gsm8k", "low", 0.5, "s"), rule)
    assert not other.ok and "sent reasoning_effort ['high'], not 'low'" in other.problems[0]


class HarmonyStub(BaseHTTPRequestHandler):
    """A chat server whose renderer ignores reasoning_effort (always `Reasoning: medium`) or spells it
    in lower case, as some chat templates do (docs/model.md)."""

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.path == "/detokenize":
            effort = "medium" if self.server.fault == "ignores" else self.server.last_effort
            word = "reasoning" if self.server.fault == "lowercase" else "Reasoning"
            reply = {"prompt": f"<|start|>system<|message|>You are ChatGPT.\n{word}: {effort}\n<|end|>"}
        else:
            self.server.last_effort = body.get("reasoning_effort")
            reply = {"choices": [{"message": {"content": "5"}}], "prompt_token_ids": [200006, 17360, 200008]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def harmony_stub(request: pytest.FixtureRequest) -> Iterator[ServerClient]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), HarmonyStub)
    server.fault, server.last_effort = request.param, None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield ServerClient(f"http://127.0.0.1:{server.server_address[1]}", "k", timeout_s=10)
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("harmony_stub", ["none", "ignores", "lowercase"], indirect=True)
def test_reasoning_effort_must_reach_the_prompt(harmony_stub: ServerClient, request: pytest.FixtureRequest):
    probe = accuracy.effort_rendered(harmony_stub, "m", "high", 10)
    fault = request.node.callspec.params["harmony_stub"]
    assert probe.ok == (fault == "none"), probe.problems
    if fault != "none":
        assert "no 'Reasoning: high' line" in probe.problems[0]


def test_accuracy_check_skips_naming_what_is_missing(tmp_path: Path):
    """Through the real plugin: the tiny model has no published figures, and the skip says so."""
    cmd = [sys.executable, "-m", "conformance", "run", "--tier", "p3", "-k", "accuracy and gsm8k",
           "--reports-dir", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    (run_dir,) = list(tmp_path.iterdir())
    (check,) = json.loads((run_dir / "results.json").read_text())["checks"]
    assert check["outcome"] == "skipped" and "needs the real gpt-oss weights" in check["message"], proc.stdout[-2000:]


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerClient, str]]:
    from conformance.checkpoints.models import tiny_gpt_oss_with_tokenizer
    from tests.conftest import start_cpu_server

    server = start_cpu_server(str(tiny_gpt_oss_with_tokenizer().path), "tiny",
                              tmp_path_factory.mktemp("server") / "server.log", api_key="plumbing-key")
    with server:
        yield server.client(), "tiny"


@pytest.mark.slow
def test_lm_eval_through_the_real_server_scores_and_judges(tiny_server, tmp_path: Path):
    client, model = tiny_server
    data = _tiny_data()
    task = accuracy.tasks(data)["gsm8k"]
    files, missing = accuracy.resolve_files(task, EVAL)
    assert not missing
    accuracy.effort_rendered(client, model, "high", 120).raise_if_failed()  # the real harmony renderer
    fork_ctx = server_fork.client_context(run_target.data()["cpu"])  # as the CPU target runs it
    assert fork_ctx is not None
    score = accuracy.run_lm_eval(accuracy.lm_eval_settings(data), client.base_url, model, client.api_key, task,
                                 "high", files, tmp_path, fork_ctx)
    assert score.samples == 4 and score.answered >= 1 and score.efforts_sent == {"high"}
    assert 0.0 <= score.score <= 1.0 and score.results_file.is_file()
    rule = accuracy.pass_rule(data)
    # a pass mark at the achieved score passes; any threshold above the achieved score fails
    at_score = score.score + rule.margin - 1e-9
    at = accuracy.accuracy_verdict(score, accuracy.Reference("tiny", "gsm8k", "high", at_score, "t"), rule)
    assert at.ok, at.problems
    above_score = score.score + rule.margin + 0.01
    above = accuracy.accuracy_verdict(score, accuracy.Reference("tiny", "gsm8k", "high", above_score, "t"), rule)
    assert not above.ok and "below the pass mark" in above.problems[0]
    with pytest.raises(CheckFailed):
        above.raise_if_failed()


@pytest.mark.slow
def test_lm_eval_failure_is_one_clear_error(tiny_server, tmp_path: Path):
    """A wrong API key: lm-eval's requests get 401, it gives up, and the error names its log."""
    client, model = tiny_server
    data = _tiny_data()
    data["lm_eval"]["max_retries"] = 1
    task = accuracy.tasks(data)["gsm8k"]
    files, _ = accuracy.resolve_files(task, EVAL)
    fork_ctx = server_fork.client_context(run_target.data()["cpu"])
    with pytest.raises(accuracy.AccuracyError, match="lm-eval exited with code") as err:
        accuracy.run_lm_eval(accuracy.lm_eval_settings(data), client.base_url, model, "wrong-key", task, "high",
                             files, tmp_path, fork_ctx)
    assert str(tmp_path / "lm-eval.log") in str(err.value)
