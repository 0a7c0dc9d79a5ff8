"""The kernel-path sweep's own body against real vLLM-CPU engines: it passes a clean engine in float32, bfloat16 and
float16, every planned forward run as planned, and fails an engine whose MoE is wrong only in forwards of more than
512 tokens (conformance/engines/faults.py moe_wrong_above_512_tokens, a kernel switch), naming the token counts past
512 and none below."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from conformance.checks import test_kernel_paths as checks
from conformance.engines.faults import MOE_SWITCH_TOKENS
from conformance.verdicts import kernel_paths
from conformance.verdicts.limits import limits_for
from tests.check_fakes import FAILED, Figures

DTYPES = ["float32", "bfloat16", "float16"]  # float16: no CPU profile serves it; the engine does
CPU = SimpleNamespace(engine="vllm", profile=SimpleNamespace(backend=SimpleNamespace(name="cpu")))


def run_check(engine, reference, dtype: str) -> Figures:
    figures = Figures()
    checks.test_forwards_match_reference_across_kernel_thresholds(engine, CPU, reference, limits_for(dtype), 300.0,
                                                                  figures)
    return figures


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_path_check_passes_a_clean_engine(dtype, tiny, reference, shared_engines):
    figures = run_check(shared_engines.get(tiny.path, dtype=dtype), reference, dtype).values
    plan = kernel_paths.sweep_plan(kernel_paths.thresholds_for("cpu"), {
        "max_num_seqs": 256, "max_num_batched_tokens": 4096, "enable_chunked_prefill": True, "max_model_len": 1024,
        "block_size": 128})
    assert figures["forwards_planned"] == len(plan) and figures["forwards_failing"] == 0
    # each group one forward, a decode group two, the chunked group two
    assert figures["forwards_run"] == len(plan) + sum(p.kind in ("decode", "chunked") for p in plan)
    assert figures["largest_forward_tokens"] == 4096
    assert figures["max_abs_dlogprob_worst_forward"] <= limits_for(dtype).kernel_paths.max_abs


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_path_check_fails_on_a_moe_wrong_above_512_tokens(dtype, tiny, reference, shared_engines):
    engine = shared_engines.get(tiny.path, dtype=dtype, planted_fault="moe_wrong_above_512_tokens")
    with pytest.raises(FAILED, match=r"forwards of 513 \(prefill\), 1023 \(prefill\), .*4096 \(prefill\) tokens "
                                     r"disagree \(a kernel path wrong at those token counts\); forwards of .*511-512 "
                                     r"tokens agree") as err:
        run_check(engine, reference, dtype)
    head = str(err.value).splitlines()[0]
    named = {int(n) for n in re.findall(r"(\d+) \((?:prefill|chunk|decode)\)", head)}
    assert named and min(named) == MOE_SWITCH_TOKENS + 1
