"""One way for a check to say no: a check module in conformance/checks/ fails through a verdict (`raise_if_failed`,
or `fail(sentence)` where the verdict is one sentence, both raising CheckFailed), never through a bare `assert`
(gone under `python -O`), `pytest.fail` or an exception of its own; `pytest.skip` and `xfail` stay as they are.
A check that could not run (its engine failed) fails the same way: its failure class comes from the exception it
was raised while handling (runrecord.classify), not from how it said no."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.checks import call_or_fail
from conformance.engines.worker import EngineDied
from conformance.run import runrecord
from conformance.run.capabilities import other_ways_to_fail
from conformance.verdicts.verdict import CheckFailed
from tests.test_run_options import refused_at_collection

CHECKS = Path(__file__).resolve().parents[1] / "conformance" / "checks"
BAD = '''import pytest


def test_a(engine):
    assert engine.ok, "not ok"
    if engine.dead:
        pytest.fail("engine died", pytrace=False)
    raise RuntimeError("no")
'''
FINE = '''import pytest

from conformance.verdicts.verdict import Problems, fail


def test_b(engine):
    if engine.skip:
        pytest.skip("not here")
    try:
        engine.call("x")
    except KeyError:
        raise
    if engine.dead:
        fail("the engine died")
    Problems(engine.problems).raise_if_failed()
'''


def test_the_lint_names_each_other_way_to_fail_by_file_and_line():
    found = other_ways_to_fail(BAD, "checks/test_bad.py")
    assert [f.split(" says no")[0] for f in found] == [
        "checks/test_bad.py:5: a bare assert", "checks/test_bad.py:7: pytest.fail",
        "checks/test_bad.py:8: raise RuntimeError('no')"]


def test_the_lint_lets_verdicts_skips_and_a_re_raise_pass():
    assert other_ways_to_fail(FINE, "test_fine.py") == []


def test_the_suites_checks_say_no_only_through_verdicts():
    found = [f for p in sorted(CHECKS.glob("*.py")) for f in other_ways_to_fail(p.read_text(), p.name)]
    assert not found, "\n".join(found)


def test_the_plugin_refuses_a_check_that_says_no_another_way_at_collection(tmp_path: Path):
    out = refused_at_collection(tmp_path, "test_asserts", "    assert 1 + 1 == 2\n")
    assert "ERROR: test_asserts.py:11: a bare assert says no outside the verdict protocol" in out


def test_an_engine_error_fails_the_check_with_check_failed_and_keeps_its_class():
    class Engine:
        def call(self, method: str, **kwargs: object) -> None:
            raise EngineDied("the engine process exited")

    with pytest.raises(CheckFailed, match="^the engine process exited$") as info:
        call_or_fail(Engine(), "generate_greedy", timeout_s=1.0)
    chain = runrecord.exception_chain(info.value)
    assert runrecord.classify("failed", str(info.value), chain) == "crash"


def test_a_check_reads_the_frozen_target_not_the_run():
    """#37: what a run tests reaches a check as `target`; a check, fixture or plan of a check module that takes
    the mutable `run` is refused at collection, by file and line. Every check of the suite passes."""
    from conformance.run.capabilities import run_taken

    source = '''import pytest


@pytest.fixture
def fixture_of_the_module(run, engines):
    return run.run_dir


def test_c(target, run_dir, *, run=None):
    return target
'''
    assert [f.split(":")[1] for f in run_taken(source, "checks/test_c.py")] == ["5", "9"]
    assert run_taken("def test_d(target, run_dir, engine_options, run_lineage):\n    pass\n", "test_d.py") == []
    found = [f for p in sorted(CHECKS.glob("*.py")) for f in run_taken(p.read_text(), p.name)]
    assert not found, "\n".join(found)


def test_the_plugin_refuses_a_check_that_takes_the_run_at_collection(tmp_path: Path):
    out = refused_at_collection(tmp_path, "test_takes_run", '    if run.dtype_name == "float16":\n        fail("no")\n')
    assert "test_takes_run.py:7: a check takes `target`" in out
