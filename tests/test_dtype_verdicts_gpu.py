"""The dtype verdicts on a GPU (skipped without one): the transformers engine in float32, bfloat16 and float16
on CUDA/HIP, the clean stack over 20 prompt seeds (0 false failures), faults planted in the engine's code and
every mutant of the reference rejected by the checks' own bodies, with each margin printed. Run on the lent
H200: `python3 -m pytest tests/test_dtype_verdicts_gpu.py -s`; figures go to $CONFORMANCE_FIGURES_OUT."""

from __future__ import annotations

import json
import os
import random
from types import SimpleNamespace

import pytest
import torch

from conformance.checks import test_logit_parity as parity
from conformance.checks import test_model_math as math_checks
from conformance.engines import components, faults
from conformance.reference import MUTATIONS, Reference
from conformance.verdicts import mathcheck
from conformance.verdicts.limits import limits_for
from tests.check_fakes import FAILED, Figures, target_of

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA or ROCm)")
DTYPES = ("float32", "bfloat16", "float16")
SEEDS = 20
RESULTS: dict = {}


class InProcess:
    """The real transformers engine in this process, answering like an engine child (worker.py)."""

    def __init__(self, model_dir, dtype: str, fault: str | None = None) -> None:
        from conformance.engines.transformers_engine import TransformersEngine

        self.engine = TransformersEngine(str(model_dir), {"device": "cuda", "dtype": dtype})
        if fault:
            faults.plant(self.engine, fault)

    def call(self, method, *args, timeout_s=None, **kwargs):
        if method.startswith("components:"):
            return getattr(components, method.removeprefix("components:"))(self.engine, *args, **kwargs)
        return getattr(self.engine, method)(*args, **kwargs)


class Engines:
    def __init__(self, engine):
        self.engine = engine

    def options(self, **overrides):
        return {"max_model_len": 1024} | overrides

    def get(self, **overrides):
        return self.engine


def _prompt_set(seed: int, vocab: int) -> SimpleNamespace:
    rng = random.Random(seed)
    return SimpleNamespace(prompts=[[rng.randrange(vocab - 8) for _ in range(n)] for n in (5, 127, 129, 200, 290)],
                           max_tokens=16)


def _layers(engine, reference, prompts, dtype) -> dict:
    figures = Figures()
    parity.test_layer_blocks_match_reference(engine, Engines(engine), reference, target_of(target="cuda", dtype=dtype),
                                             limits_for(dtype), prompts, SimpleNamespace(config=reference.cfg), 600.0,
                                             figures)
    return figures.values


@pytest.fixture(scope="module", autouse=True)
def _dump():
    yield
    out = os.environ.get("CONFORMANCE_FIGURES_OUT")
    if out:
        with open(out, "w") as fh:
            json.dump(RESULTS, fh, indent=1, default=str)


@pytest.mark.parametrize("dtype", DTYPES)
def test_clean_stack_passes_every_seed_and_mutants_fail(dtype, tiny, reference):
    engine = InProcess(tiny.path, dtype)
    vocab = int(reference.cfg["vocab_size"])
    ratios = []
    for seed in range(SEEDS):
        ratios.append(_layers(engine, reference, _prompt_set(seed, vocab), dtype)["layer_worst_ratio_to_limit"])
    clean = max(ratios)
    rope = Figures()
    math_checks.test_rope_tables_match_reference(engine, reference, limits_for(dtype), 600.0, rope)
    row = {"clean_worst_ratio_max_over_seeds": clean, "clean_worst_ratio_median": sorted(ratios)[SEEDS // 2],
           "rope_clean": rope.values, "mutants": {}}
    prompts = _prompt_set(0, vocab)
    missed = []
    tol = limits_for(dtype).layers
    probes = engine.call("components:layer_io", [*prompts.prompts, prompts.prompts[-1] * 3], 8)
    for name in MUTATIONS:
        report = mathcheck.layers_close(probes, Reference(tiny.path, name), tol)
        worst = report.measured["layer_worst_ratio_to_limit"]
        row["mutants"][name] = {"worst_ratio": worst, "margin_over_clean": worst / clean,
                                "failing_strata": report.problems[:3]}
        if name == "yarn_rounded":  # its angles drift with position: the RoPE table check owns it
            try:
                math_checks.test_rope_tables_match_reference(engine, Reference(tiny.path, name), limits_for(dtype),
                                                             600.0, Figures())
                missed.append(name)
            except FAILED as exc:
                row["mutants"][name]["rope_check"] = str(exc).splitlines()[0][:300]
            continue
        if report.ok or worst < 3 * clean:
            missed.append(name)
    RESULTS[dtype] = row
    print(json.dumps({dtype: row}, indent=1, default=str))
    assert clean < 1.0, f"clean {dtype} stack exceeded a limit: worst ratio {clean:.3g}"
    assert not missed, f"mutants not rejected with a 3x margin in {dtype}: {missed}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fault", faults.FAULTS)
def test_planted_engine_faults_fail_the_checks(fault, dtype, tiny, reference):
    engine = InProcess(tiny.path, dtype, fault)
    prompts = _prompt_set(0, int(reference.cfg["vocab_size"]))
    rope_failed = layers_failed = False
    message = ""
    try:
        math_checks.test_rope_tables_match_reference(engine, reference, limits_for(dtype), 600.0,
                                                     Figures())
    except FAILED as exc:
        rope_failed, message = True, str(exc).splitlines()[0]
    try:
        _layers(engine, reference, prompts, dtype)
    except FAILED as exc:
        layers_failed, message = True, message + " | " + str(exc).splitlines()[0]
    RESULTS.setdefault("faults", {})[f"{fault}/{dtype}"] = {"rope_failed": rope_failed,
                                                           "layers_failed": layers_failed, "message": message[:600]}
    print(fault, dtype, rope_failed, layers_failed, message[:300])
    assert layers_failed or rope_failed
    if fault.startswith("rope_"):
        assert rope_failed and "long-context defect" in message
