"""Tensor parallelism: the fp64 reference's attention and MoE layers sharded as vLLM shards gpt-oss
(heads, replicated kv heads, interleaved gate/up rows, the uneven 90-block MXFP4 split of 2880 at
TP 4 and 8), run as real ranks with all-reduces, recombine to the unsharded layer; and vLLM itself
at TP > 1 holds, on each rank, the shard of the reference's weights vLLM's sharding rule gives that
rank, generates what TP = 1 and the fp64 reference generate, and answers the kernel-path sweep of
checks/test_kernel_paths.py as TP = 1 must."""

from __future__ import annotations

import pytest

from conformance import distributed
from conformance.checks.test_kernel_paths import backend_of, sweep_forwards
from conformance.distributed import tp_checkpoints, tp_shards
from conformance.distributed import tp_reference as tpref
from conformance.distributed.tp_engine import TPEngineProcess, tp_settings
from conformance.engines.worker import EngineError
from conformance.reference import Reference
from conformance.verdicts import compare
from conformance.verdicts.verdict import fail, raise_all, record_figures

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
    Limits: distributed.toml [tp] rel_tol
    Controls:
      tests/controls/test_tp_sharding_controls.py::test_tp_sharding_check_fails_when_a_partial_is_never_all_reduced
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
    record_figures(record_figure, report)
    report.raise_if_failed()


@pytest.fixture(scope="module")
def vllm_tp(target, run_dir, engines):
    """(vLLM at tensor_parallel_size > 1 on the model under test, its TP size), started once for this
    module's checks; a start that fails is the checks' failure."""
    overrides, env, reason = tp_settings(target.name, len(target.devices))
    if reason:
        pytest.skip(reason)
    options = engines.options(**overrides)
    tp = int(overrides["tensor_parallel_size"])
    log = run_dir / f"engine-vllm-tp{tp}.log"
    try:
        proc = TPEngineProcess(str(engines.model.path), options, dict(target.env), log,
                               start_timeout_s=target.timeouts.engine_start_s, start_method=target.start_method("vllm"),
                               run_time_env=env)
    except EngineError as exc:
        fail(str(exc))
    yield proc, tp
    proc.close()


@pytest.mark.p1
@pytest.mark.needs("tensor_parallel")
def test_vllm_tp_greedy_matches_tp1(vllm_tp, engine_greedy, prompts, tolerance, reference, call_timeout_s,
                                    record_figure):
    """vLLM with tensor_parallel_size > 1 (2 on the CPU default through the mp executor, all visible
    GPUs on a GPU box) generates the same greedy tokens as the engine under test at TP = 1, and its
    prompt and decode logprobs agree, within the run dtype's tolerance (top-k rule), with TP = 1 and
    with the fp64 reference. In bf16/fp16 two engines whose reductions differ can part greedy paths on noise
    alone (vLLM-CPU bf16: TP = 1 gave a token 4.4 above the reference's logprob for it, TP = 2 another), so there
    TP > 1 answers to TP = 1 by the distribution limits and to the reference by the full rule
    (tolerances.toml pairwise_greedy).

    Catches: accuracy collapsing at TP>1 (MoE padding, sharded sinks, a missing all-reduce), a
    custom all-reduce kernel corrupting activations, TP setups that fail to start or hang, a TP > 1
    that agrees with a TP = 1 that is itself off the reference.
    Reference: https://docs.vllm.ai/en/latest/serving/parallelism_scaling.html ; docs/failure-modes.md, mode 8
    Limits: tolerances.toml [logprobs.<dtype>]
    Controls: tests/controls/test_tp_sharding_controls.py::test_vllm_tp_check_fails_when_tp2_generates_other_tokens,
      tests/controls/test_tp_sharding_controls.py::test_vllm_tp_check_fails_when_tp2_drifts_from_the_reference
    """
    proc, tp = vllm_tp
    tol, top_k = tolerance
    try:
        got = proc.call("generate_greedy", prompts.prompts, prompts.max_tokens, top_k, prompt_logprobs=True,
                        timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    want, _ = engine_greedy
    report = compare.completions_equivalent(got, want, tol, (f"vLLM TP={tp}", "vLLM TP=1"), tol.pairwise_greedy)
    scored = reference.score_all(got, top_k + 5)
    vs_ref = compare.logprobs_close(got, scored, tol, (f"vLLM TP={tp}", "fp64 reference"))
    record_figure("tensor_parallel_size", tp)
    record_figures(record_figure, report)
    record_figures(record_figure, vs_ref, prefix="reference_")
    raise_all(report, vs_ref)


@pytest.mark.p1
@pytest.mark.needs("tensor_parallel")
def test_vllm_tp_shards_match_reference(vllm_tp, reference, call_timeout_s, record_figure):
    """Each rank of vLLM at TP > 1 holds, as its loader placed them, the shard of the checkpoint that
    vLLM's sharding rule gives that rank, element for element against the fp64 reference's weights cut
    by the same rule: qkv_proj rows (the rank's q heads, its kv heads' k and v, replicated when TP >=
    kv heads), o_proj columns with the whole bias, sinks by head, the vocab-parallel embedding and
    lm_head rows (zero padding), and expert weights with room for the rank's intermediate slice. Read
    from every worker through LLM.apply_model; tensors the CPU kernels keep only packed are counted.

    Catches: a loader or checkpoint option that permutes heads, two ranks holding each other's shards,
    kv heads replicated onto the wrong ranks, a vocab split off by the padding, an expert partition
    smaller than the loader's slice, a rank missing a tensor.
    Reference: https://github.com/vllm-project/vllm/blob/main/vllm/model_executor/layers/linear.py ;
      https://github.com/vllm-project/vllm/blob/main/vllm/model_executor/models/gpt_oss.py
    Controls: tests/controls/test_tp_sharding_controls.py::test_shard_check_fails_when_two_ranks_shards_are_swapped,
      tests/controls/test_tp_sharding_controls.py::test_shard_check_fails_on_heads_permuted_within_a_rank
    """
    proc, tp = vllm_tp
    try:
        per_rank = proc.call("components:tp_shards", timeout_s=call_timeout_s)
    except EngineError as exc:
        fail(str(exc))
    cfg = dict(reference.cfg) | {"head_dim": reference.head_dim}
    problems, figures = tp_shards.shard_problems(per_rank, reference.w, cfg, tpref.is_mxfp4(reference))
    record_figures(record_figure, figures)
    if problems:
        fail(f"vLLM TP={tp} shards differ from the reference's split: " + "; ".join(problems[:8])
             + (f"; and {len(problems) - 8} more" if len(problems) > 8 else ""))


@pytest.mark.p1
@pytest.mark.needs("tensor_parallel")
def test_vllm_tp_forwards_match_reference_across_kernel_thresholds(vllm_tp, target, reference, limits, call_timeout_s,
                                                                   record_figure):
    """The kernel-path sweep of test_kernel_paths.py::test_forwards_match_reference_across_kernel_thresholds (forwards
    of t-1, t and t+1 tokens around every threshold of data/kernel_paths.toml for the backend, capped by the engine's
    limits, each judged against the fp64 reference on the positions it computed), on vLLM at tensor_parallel_size > 1
    (its size from data/distributed.toml [tp.vllm.<target>]: 2 on the CPU default, every visible GPU on a GPU box):
    the same verdicts at TP > 1 as at TP = 1.

    Catches: a kernel path chosen by shape and TP together — each rank's MoE sees the whole token count with a slice
    of the intermediate size, so the kernel, tile and padding a rank picks differ from TP = 1's
    (vllm-project/vllm#44679: FlyDSL at TP 1, CKTile at TP 8, padded differently) — wrong at some token counts only.
    Reference: https://github.com/vllm-project/vllm/issues/44679 ;
      https://docs.vllm.ai/en/latest/serving/parallelism_scaling.html
    Limits: tolerances.toml [kernel_paths.<dtype>]
    Controls:
      tests/controls/test_tp_sharding_controls.py::test_vllm_tp_kernel_path_check_fails_on_a_moe_wrong_above_512_tokens
    """
    proc, tp = vllm_tp
    record_figure("tensor_parallel_size", tp)
    sweep_forwards(proc, reference, backend_of(target), limits, call_timeout_s, record_figure,
                   f"vLLM TP={tp}").raise_if_failed()
