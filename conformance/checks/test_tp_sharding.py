"""Tensor parallelism: the fp64 reference's attention and MoE layers sharded as vLLM shards gpt-oss
(heads, replicated kv heads, interleaved gate/up rows, the uneven 90-block MXFP4 split of 2880 at
TP 4 and 8), run as real ranks with all-reduces, recombine to the unsharded layer; and vLLM itself
at TP > 1 generates what TP = 1 generates."""

from __future__ import annotations

import pytest

from conformance import compare, distributed, settings, tp_checkpoints
from conformance.engines.worker import EngineError
from conformance.reference import Reference
from conformance.reference import tp as tpref
from conformance.tp_engine import TPEngineProcess, tp_settings

AREA = "tensor-parallel"
TP = distributed.data()["tp"]
CASES = [(name, layout, size) for name, row in TP["models"].items() for layout in row["layouts"]
         for size in row["tp_sizes"]]


@pytest.fixture(scope="module")
def unsharded() -> dict:
    """Unsharded layer outputs per (model, layout), computed once."""
    return {}


@pytest.mark.p1
@pytest.mark.parametrize(("model", "layout", "tp"), CASES, ids=[f"{m}-{lay}-tp{t}" for m, lay, t in CASES])
def test_tp_sharding_recombines_to_unsharded(model, layout, tp, unsharded, record_figure):
    """Each rank holds what vLLM's gpt-oss loader gives it (q heads and sinks by rank, kv heads split
    or replicated, o_proj columns with the bias on rank 0, gate_up rows 2*start..2*end, down columns
    start..end, MXFP4 slices of cdiv(blocks, TP) blocks zero-padded to the backend's partition); the
    ranks run as gloo processes and all-reduce attention and MoE outputs, which must equal the
    unsharded fp64 layer within 1e-10 relative. The 120b slice has the real dims: 2880 = 90 blocks
    splits 736/736/736/672 at TP 4 and 7 x 384 + 192 at TP 8.

    Catches: a sharding that splits gate/up as halves, an o_proj partial never all-reduced, the uneven
    tail block dropped, biases added on every rank, replicated kv heads mapped to the wrong ranks, a
    backend partition too small for the loader's block-rounded slice (accuracy lost at TP>1 from padding).
    Reference: docs/model.md "MXFP4"; docs/failure-modes.md, mode 8; https://github.com/vllm-project/vllm/blob/main/vllm/model_executor/models/gpt_oss.py
    Controls: tests/test_check_bodies_platform.py::test_tp_sharding_check_fails_when_a_partial_is_never_all_reduced
    """
    path = tp_checkpoints.tp_checkpoint(model, layout)
    if (model, layout) not in unsharded:
        ref = Reference(path)
        layers = list(range(int(ref.cfg["num_hidden_layers"])))
        unsharded[(model, layout)] = (layers, tpref.layer_outputs(ref, layers, TP["tokens"], TP["seed"]), ref.cfg)
    layers, want, cfg = unsharded[(model, layout)]
    alignment = int(TP["mxfp4_pad_alignment"][TP["compute_alignment"]])
    blob = distributed.launch(distributed.host_plan(tp, float(TP["timeout_s"])), tpref.tp_rank, str(path), layers,
                              alignment, TP["tokens"], TP["seed"])[0]
    report = tpref.recombined_close(tpref.load_outputs(blob), want, float(TP["rel_tol"]), f"{model} {layout} TP {tp}")
    inter = int(cfg["intermediate_size"])
    ranges = tpref.intermediate_ranges(inter, tp, layout == "mxfp4")
    record_figure("intermediate_first_rank", ranges[0][1] - ranges[0][0])
    record_figure("intermediate_last_rank", ranges[-1][1] - ranges[-1][0])
    if layout == "mxfp4":
        report.problems += tpref.partition_problems(inter, tp, TP["mxfp4_pad_alignment"])
    for name, value in report.figures.items():
        record_figure(name, value)
    report.raise_if_failed()


@pytest.mark.p1
def test_vllm_tp_greedy_matches_tp1(run, engines, engine_greedy, prompts, tolerance, call_timeout_s, record_figure):
    """vLLM with tensor_parallel_size > 1 (2 on the CPU default through the mp executor, all visible
    GPUs on a GPU box) generates the same greedy tokens as the engine under test at TP = 1, and its
    prompt and decode logprobs agree within the run dtype's tolerance (top-k rule).

    Catches: accuracy collapsing at TP>1 (MoE padding, sharded sinks, a missing all-reduce), a
    custom all-reduce kernel corrupting activations, TP setups that fail to start or hang.
    Reference: https://docs.vllm.ai/en/latest/serving/parallelism_scaling.html ; docs/failure-modes.md, mode 8
    Controls: tests/test_check_bodies_engine.py::test_vllm_tp_check_fails_when_tp2_generates_other_tokens
    """
    if run.engine != "vllm":
        pytest.skip(f"the engine under test is {run.engine}: tensor parallelism is a vLLM feature")
    target = run.resolved()
    overrides, env, reason = tp_settings(target.resolved, len(target.devices))
    if reason:
        pytest.skip(reason)
    tol, top_k = tolerance
    table = settings.targets()
    options = engines.options(**overrides)
    env = dict(table[target.resolved].get("env", {})) | env
    tp = int(overrides["tensor_parallel_size"])
    try:
        proc = TPEngineProcess(str(engines.model.path), options, env, run.run_dir / f"engine-vllm-tp{tp}.log",
                               start_timeout_s=float(table["timeouts"]["engine_start_s"]))
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        got = proc.call("generate_greedy", prompts.prompts, prompts.max_tokens, top_k, prompt_logprobs=True,
                        timeout_s=call_timeout_s)
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)
    finally:
        proc.close()
    want, _ = engine_greedy
    report = compare.completions_equivalent(got, want, tol, (f"vLLM TP={tp}", "vLLM TP=1"))
    record_figure("tensor_parallel_size", tp)
    for name, value in report.figures().items():
        record_figure(name, value)
    report.raise_if_failed()
