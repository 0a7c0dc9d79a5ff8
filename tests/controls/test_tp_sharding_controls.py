"""Negative controls of the checks that judge vLLM's real TP shards and TP > 1 against the fp64 reference:
they run the checks' own bodies (conformance/checks/test_tp_sharding.py) on read-backs built the way
the engine's workers return them (conformance/distributed/tp_shards.py read_shards), from the suite's TP checkpoint,
with one planted fault each, and see the failure name the tensor and the rank."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch

from conformance import distributed
from conformance.checks import test_tp_sharding as tp_checks
from conformance.checks import test_tp_sharding as tp_sharding
from conformance.distributed import tp_checkpoints, tp_shards
from conformance.distributed import tp_reference as tpref
from conformance.engines.base import Completion, StepLogprobs
from conformance.reference import Reference
from conformance.run import run_target
from conformance.verdicts.limits import limits_for
from tests.check_fakes import (
    FAILED,
    PROMPTS,
    TOL,
    Figures,
    completion,
    greedy,
    scoring,
)


@pytest.fixture(scope="module")
def ref() -> Reference:
    """The tiny TP checkpoint (8 heads, 2 kv heads, intermediate 160) in the plain layout."""
    return Reference(tp_checkpoints.tp_checkpoint("tiny", "plain"))


def _cfg(ref: Reference) -> dict:
    return dict(ref.cfg) | {"head_dim": ref.head_dim}


def read_back(ref: Reference, tp: int, dtype: torch.dtype = torch.float32, partition: int | None = None,
              packed: bool = True) -> list[dict]:
    """What `read_shards` returns from each rank of a correct engine: the reference's split, in the
    engine's dtype, the o_proj/qkv weights repacked as vLLM-CPU does (`packed`), the experts' shapes."""
    cfg, out = _cfg(ref), []
    hidden, experts = int(cfg["hidden_size"]), int(cfg["num_local_experts"])
    for rank in range(tp):
        exp = tp_shards.expected_shards(ref.w, cfg, tp, rank)
        part = exp.inter_slice if partition is None else partition
        repacked = [n for n in exp.tensors if packed and n.endswith(("qkv_proj.weight", "o_proj.weight"))]
        tensors = {n: t.to(dtype) for n, t in exp.tensors.items() if n not in repacked}
        shapes = {f"model.layers.{i}.mlp.experts.routed_experts.w13_weight": (experts, 2 * part, hidden)
                  for i in range(int(cfg["num_hidden_layers"]))}
        out.append({"rank": rank, "world_size": tp, "tensors": tensors, "shapes": shapes, "repacked": repacked})
    return out


class _Proc:
    def __init__(self, answer) -> None:
        self.answer = answer

    def call(self, method, *args, **kwargs):
        return self.answer(*args) if callable(self.answer) else self.answer


def test_correct_read_back_passes_and_counts(ref):
    for tp in (2, 4, 8):
        problems, figures = tp_shards.shard_problems(read_back(ref, tp), ref.w, _cfg(ref))
        assert problems == [], problems
        assert figures["shards_compared"] > 0 and figures["shards_repacked"] > 0 and figures["ranks_read"] == tp
        problems, figures = tp_shards.shard_problems(read_back(ref, tp, packed=False), ref.w, _cfg(ref))
        assert problems == [] and figures["shards_repacked"] == 0


def test_shard_problems_fail_on_q_heads_permuted_in_the_weight(ref):
    """Where the engine keeps its qkv weight (GPU), two q heads swapped inside rank 0's rows fail."""
    ranks, d = read_back(ref, 2, packed=False), int(_cfg(ref)["head_dim"])
    name = "model.layers.1.attn.qkv_proj.weight"
    w = ranks[0]["tensors"][name].clone()
    w[:d], w[d:2 * d] = ranks[0]["tensors"][name][d:2 * d], ranks[0]["tensors"][name][:d]
    ranks[0]["tensors"][name] = w
    problems, _ = tp_shards.shard_problems(ranks, ref.w, _cfg(ref))
    assert len(problems) == 1 and problems[0].startswith(f"rank 0 {name}: ") and "first at (0, " in problems[0]


def test_shard_check_fails_when_two_ranks_shards_are_swapped(ref):
    ranks = read_back(ref, 2)
    name = "model.layers.1.attn.qkv_proj.bias"
    ranks[0]["tensors"][name], ranks[1]["tensors"][name] = ranks[1]["tensors"][name], ranks[0]["tensors"][name]
    with pytest.raises(FAILED, match=r"rank 0 model\.layers\.1\.attn\.qkv_proj\.bias: holds rank 1's slice"):
        tp_sharding.test_vllm_tp_shards_match_reference((_Proc(ranks), 2), ref, 1.0, Figures())


def test_shard_check_fails_on_heads_permuted_within_a_rank(ref):
    """A checkpoint/loader option that permutes q heads: rank 1's sinks hold its two heads swapped."""
    ranks = read_back(ref, 2)
    name = "model.layers.0.attn.sinks"
    ranks[1]["tensors"][name] = ranks[1]["tensors"][name].flip(0)
    with pytest.raises(FAILED, match=r"rank 1 model\.layers\.0\.attn\.sinks: \d+ of 4 elements differ from the "
                                     r"reference's rank-1 slice"):
        tp_sharding.test_vllm_tp_shards_match_reference((_Proc(ranks), 2), ref, 1.0, Figures())


def test_shard_problems_name_kv_heads_replicated_onto_the_wrong_ranks(ref):
    """TP 8 over 2 kv heads: rank 1 must hold kv head 0 (rank // 4); a rank % kv mapping gives it head 1."""
    ranks, cfg = read_back(ref, 8), _cfg(ref)
    d, h = int(cfg["head_dim"]), 1  # one q head per rank at TP 8
    a = "model.layers.0.self_attn."
    wrong = torch.cat([ref.w[a + "q_proj.bias"][1 * d:2 * d], ref.w[a + "k_proj.bias"][h * d:(h + 1) * d],
                       ref.w[a + "v_proj.bias"][h * d:(h + 1) * d]]).float()
    ranks[1]["tensors"]["model.layers.0.attn.qkv_proj.bias"] = wrong
    problems, _ = tp_shards.shard_problems(ranks, ref.w, cfg)
    assert len(problems) == 1 and problems[0].startswith("rank 1 model.layers.0.attn.qkv_proj.bias: ")
    assert "elements differ" in problems[0]


def test_shard_problems_fail_on_a_vocab_split_without_padding(ref):
    ranks = read_back(ref, 2)
    name = "lm_head.weight"
    ranks[1]["tensors"][name] = ranks[1]["tensors"][name][:-1]
    problems, _ = tp_shards.shard_problems(ranks, ref.w, _cfg(ref))
    assert problems and problems[0].startswith(f"rank 1 {name}: shape ")


def test_shard_problems_fail_on_a_missing_tensor_and_on_wrong_ranks(ref):
    ranks = read_back(ref, 2)
    del ranks[0]["tensors"]["model.layers.0.attn.sinks"]
    problems, _ = tp_shards.shard_problems(ranks, ref.w, _cfg(ref))
    assert problems == ["rank 0 model.layers.0.attn.sinks: not held by the engine (its parameters have no such tensor)"]
    ranks = read_back(ref, 2)
    ranks[1]["rank"] = 0
    problems, _ = tp_shards.shard_problems(ranks, ref.w, _cfg(ref))
    assert problems and "the workers reported ranks [0, 0]" in problems[0]
    nothing = [r | {"tensors": {}, "repacked": []} for r in read_back(ref, 2)]
    problems, _ = tp_shards.shard_problems(nothing, ref.w, _cfg(ref))
    assert any("no sharded tensor was compared" in p for p in problems)


def test_shard_problems_fail_when_an_expert_partition_is_smaller_than_the_loaders_slice(ref):
    """The judgement `partition_problems` used to make on constants, now on the engine's real shapes:
    intermediate 160 at TP 2 is 80 rows per rank (MXFP4: 3 blocks = 96 on rank 0); a 64-row partition
    cannot hold either."""
    problems, _ = tp_shards.shard_problems(read_back(ref, 2, partition=64), ref.w, _cfg(ref))
    assert problems and "holds 64 intermediate rows per expert, less than the 80 the loader copies" in problems[0]
    problems, _ = tp_shards.shard_problems(read_back(ref, 2, partition=80), ref.w, _cfg(ref), mxfp4=True)
    assert problems and "less than the 96 the loader copies at TP 2" in problems[0]
    assert not tp_shards.shard_problems(read_back(ref, 2, partition=96), ref.w, _cfg(ref), mxfp4=True)[0]


def test_bf16_engine_shards_are_judged_after_rounding(ref):
    ranks = read_back(ref, 2, dtype=torch.bfloat16)
    assert tp_shards.shard_problems(ranks, ref.w, _cfg(ref))[0] == []
    name = "model.layers.0.attn.o_proj.bias"
    t = ranks[0]["tensors"][name].clone()
    t[3] = t[3] + t[3].abs().clamp_min(1e-3)  # beyond the rounding of one element
    ranks[0]["tensors"][name] = t
    problems, _ = tp_shards.shard_problems(ranks, ref.w, _cfg(ref))
    assert problems and problems[0].startswith(f"rank 0 {name}: 1 of ") and "first at (3,)" in problems[0]


def _completion(prompt: list[int], tokens: list[int], lp: float) -> Completion:
    return Completion(list(prompt), list(tokens), [StepLogprobs(t, {t: lp, t + 1: lp - 3}) for t in tokens])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vllm_tp_check_fails_when_tp2_drifts_from_the_reference(dtype):
    """TP 2 agrees with TP 1 token for token and logprob for logprob, but both are 2.5 nats off the
    fp64 reference: only the comparison with the reference can see it, in bf16 too, where TP 2 answers to TP 1
    by the distribution limits alone."""
    prompts = SimpleNamespace(prompts=[list(range(1, 20)), list(range(30, 40))], max_tokens=3)
    engine = [_completion(p, [5, 6, 7], -0.5) for p in prompts.prompts]
    reference = scoring(lambda prompt, tokens, k: _completion(prompt, tokens, -3.0))
    with pytest.raises(FAILED, match="fp64 reference"):
        tp_sharding.test_vllm_tp_greedy_matches_tp1((_Proc(engine), 2), (engine, 1.0), prompts,
                                                    limits_for(dtype).logprobs, reference, 1.0, Figures())


def test_vllm_tp_check_in_bfloat16_lets_two_healthy_engines_part_on_noise():
    """bf16: TP 1 and TP 2 part at a step (top-5 sets disjoint, as vLLM-CPU bf16 did), each within the
    reference's limits: the check passes and counts the parting; under fp32 limits the same outputs fail."""
    prompts = SimpleNamespace(prompts=[list(range(1, 20))], max_tokens=2)
    first = StepLogprobs(5, {5: -0.5, 6: -2.0})
    tp1 = [Completion(prompts.prompts[0], [5, 9], [first, StepLogprobs(9, {9: -1.6, 8: -2.4})])]
    tp2 = [Completion(prompts.prompts[0], [5, 1], [first, StepLogprobs(1, {1: -2.2, 3: -2.5})])]
    reference = scoring(lambda prompt, tokens, k: Completion(prompt, tokens, [
        StepLogprobs(5, {5: -0.5, 6: -2.0}), StepLogprobs(tokens[1], {1: -2.2, 3: -2.5, 9: -2.0, 8: -2.4})]))
    figures = Figures()
    tp_sharding.test_vllm_tp_greedy_matches_tp1((_Proc(tp2), 2), (tp1, 1.0), prompts, limits_for("bfloat16").logprobs,
                                                reference, 1.0, figures)
    assert figures.values["greedy_divergences"] == 1
    with pytest.raises(FAILED, match="share no token"):
        tp_sharding.test_vllm_tp_greedy_matches_tp1((_Proc(tp2), 2), (tp1, 1.0), prompts,
                                                    limits_for("float32").logprobs, reference, 1.0, Figures())


class _SwappedRanks:
    """A real TP engine whose shard read-back comes back with ranks 0 and 1 holding each other's tensors."""

    def __init__(self, proc) -> None:
        self.proc = proc

    def call(self, method, *args, **kwargs):
        got = self.proc.call(method, *args, **kwargs)
        if method == "components:tp_shards":
            got[0]["tensors"], got[1]["tensors"] = got[1]["tensors"], got[0]["tensors"]
        return got


def _heads_permuted_copy(src, dst, n_heads: int, head_dim: int):
    """The checkpoint with q heads 0 and n/2 swapped (q_proj rows and bias, sinks, o_proj columns): the
    same model, sharded differently; an engine that loaded the original holds the wrong heads for it."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    w = load_file(str(src / "model.safetensors"))
    a, b, d = 0, n_heads // 2, head_dim
    perm = list(range(n_heads))
    perm[a], perm[b] = b, a
    rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in perm])
    for name in list(w):
        if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
            w[name] = w[name][rows].contiguous()
        elif name.endswith("self_attn.o_proj.weight"):
            w[name] = w[name][:, rows].contiguous()
        elif name.endswith("self_attn.sinks"):
            w[name] = w[name][torch.tensor(perm)].contiguous()
    save_file(w, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.slow
def test_real_vllm_cpu_tp2_shards_judged_against_the_reference(tiny, tmp_path):
    """A real vLLM-CPU engine at TP 2 (mp executor, one core per rank): the shards every worker reports
    match the reference's split; the same read-back with two ranks swapped, or judged against the
    checkpoint with q heads permuted across the rank boundary, fails naming the tensor and the rank."""
    from conformance.distributed.tp_engine import TPEngineProcess, tp_settings
    from conformance.engines.worker import EngineError

    overrides, env, reason = tp_settings("cpu", 0)
    if reason:
        pytest.skip(reason)
    table = run_target.data()
    options = dict(table["cpu"]["vllm"]) | {"dtype": "float32"} | overrides
    ref, log = Reference(tiny.path), tmp_path / "engine-tp2.log"  # 4 heads, 2 kv heads: 2 q heads, 1 kv head a rank
    try:
        proc = TPEngineProcess(str(tiny.path), options, dict(table["cpu"]["env"]), log,
                               start_timeout_s=max(400.0, float(table["timeouts"]["engine_start_s"])),
                               start_method=table["cpu"]["engine_start"], run_time_env=env)
    except EngineError as exc:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:]) if log.is_file() else ""
        pytest.fail(f"{exc}\n{tail}", pytrace=False)
    try:
        figures = Figures()
        tp_sharding.test_vllm_tp_shards_match_reference((proc, 2), ref, 120.0, figures)
        assert figures.values["shards_compared"] > 0 and figures.values["ranks_read"] == 2
        with pytest.raises(FAILED, match=r"rank 0 model\.layers\.0\.attn\.\w+\.bias: holds rank 1's slice"):
            tp_sharding.test_vllm_tp_shards_match_reference((_SwappedRanks(proc), 2), ref, 120.0, Figures())
        permuted = Reference(_heads_permuted_copy(tiny.path, tmp_path / "perm", int(ref.cfg["num_attention_heads"]),
                                                  int(ref.head_dim)))
        with pytest.raises(FAILED, match=r"rank 0 model\.layers\.0\.attn\.qkv_proj\.bias: \d+ of \d+ elements "
                                         r"differ from the reference's rank-0 slice"):
            tp_sharding.test_vllm_tp_shards_match_reference((proc, 2), permuted, 120.0, Figures())
    finally:
        proc.close()


@pytest.mark.slow
def test_vllm_tp_kernel_path_check_fails_on_a_moe_wrong_above_512_tokens(tiny, tmp_path):
    """A real vLLM-CPU engine at TP 2 whose every rank's MoE is wrong in forwards of more than 512 tokens
    (faults.py moe_wrong_above_512_tokens): the TP kernel-path check fails naming 513 and not 512."""
    from conformance.distributed.tp_engine import TPEngineProcess, tp_settings
    from conformance.engines.worker import EngineError

    overrides, env, reason = tp_settings("cpu", 0)
    if reason:
        pytest.skip(reason)
    table = run_target.data()
    options = dict(table["cpu"]["vllm"]) | {"dtype": "float32", "planted_fault": "moe_wrong_above_512_tokens"}
    log = tmp_path / "engine-tp2-moe-switch.log"
    try:
        proc = TPEngineProcess(str(tiny.path), options | overrides, dict(table["cpu"]["env"]), log,
                               start_timeout_s=max(400.0, float(table["timeouts"]["engine_start_s"])),
                               start_method=table["cpu"]["engine_start"], run_time_env=env)
    except EngineError as exc:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:]) if log.is_file() else ""
        pytest.fail(f"{exc}\n{tail}", pytrace=False)
    cpu = SimpleNamespace(engine="vllm", profile=SimpleNamespace(backend=SimpleNamespace(name="cpu")))
    try:
        with pytest.raises(FAILED, match=r"vLLM TP=2 vs fp64 reference over \d+ forwards .*: forwards of 513 "
                                         r"\(prefill\), .* tokens disagree .*; forwards of .*511-512 tokens agree"):
            tp_sharding.test_vllm_tp_forwards_match_reference_across_kernel_thresholds(
                (proc, 2), cpu, Reference(tiny.path), limits_for("float32"), 300.0, Figures())
    finally:
        proc.close()


class _TPProc:
    """TPEngineProcess stand-in: a TP=2 engine whose greedy tokens differ from TP=1."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def call(self, method, prompts, *args, **kwargs):
        return greedy(prompts, lambda p: [11, 11, 11, 11])

    def close(self) -> None:
        pass


def test_vllm_tp_check_fails_when_tp2_generates_other_tokens():
    reference = scoring(lambda prompt, tokens, k: completion(prompt, tokens))  # agrees with TP=2
    with pytest.raises(FAILED, match="vLLM TP=2 chose 11"):
        tp_sharding.test_vllm_tp_greedy_matches_tp1((_TPProc(), 2), (greedy(PROMPTS.prompts), 1.0), PROMPTS, TOL,
                                                    reference, 1.0, Figures())


def test_tp_sharding_check_fails_when_a_partial_is_never_all_reduced(monkeypatch):
    """Each rank's partial attention/MoE output returned as if it were the sum (no all-reduce): half of it."""
    def launch(plan, fn, path, layers, alignment, tokens, seed):
        out = tpref.layer_outputs(Reference(path), layers, tokens, seed)
        buf = io.BytesIO()
        torch.save({k: v / 2 for k, v in out.items()}, buf)
        return [buf.getvalue()]
    monkeypatch.setattr(distributed, "launch", launch)
    with pytest.raises(FAILED, match="TP sharding tiny plain TP 2"):
        tp_checks.test_tp_sharding_recombines_to_unsharded("tiny", "plain", 2, {}, Figures())
