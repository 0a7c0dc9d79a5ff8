"""Controls of the transformers engine's graph mode (engines/graph_decode.py), the graph-vs-eager
check's engine where vLLM is absent. On the CPU the static-cache decode runs step by step (no
capture) and must reproduce eager; a stale input buffer must be rejected. On a CUDA/HIP device the
same runs with the decode step captured as a graph and replayed."""

from __future__ import annotations

import pytest

from conformance.checkpoints.models import TinyModel
from conformance.engines import graph_decode
from conformance.engines.transformers_engine import TransformersEngine
from conformance.verdicts import perf
from conformance.verdicts.limits import limits_for

torch = pytest.importorskip("torch")
GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def device() -> str:
    return "cuda" if GPU else "cpu"


@pytest.fixture(scope="module")
def eager_and_graph_model(tiny: TinyModel, device: str):
    eager = TransformersEngine(str(tiny.path), {"dtype": "float32", "device": device})
    graph = TransformersEngine(str(tiny.path), {"dtype": "float32", "device": device, "enforce_eager": False})
    assert graph.info()["backends"] == {"attention": "eager", "moe": "batched_mm", "decode": "graphs"}
    return eager, graph


@pytest.fixture(scope="module")
def eager_completions(eager_and_graph_model, tiny_prompts):
    """The eager engine's greedy completions of the P0 prompts, which both sides below are held to."""
    prompts, max_tokens = tiny_prompts
    return eager_and_graph_model[0].generate_greedy(prompts, max_tokens, limits_for("float32").logprobs[1],
                                                    prompt_logprobs=True)


def _decode(engine: TransformersEngine, device: str, prompts, max_tokens: int, top_k: int, fault=None):
    decoder = graph_decode.GraphDecoder(engine.model, device, max(map(len, prompts)) + max_tokens, fault,
                                        capture=device != "cpu")
    return [decoder.generate(p, max_tokens, top_k, prompt_logprobs=True) for p in prompts], decoder


def test_static_cache_decode_matches_eager_and_planted_graph_bugs_are_rejected(eager_and_graph_model, tiny_prompts,
                                                                                device, eager_completions):
    _, graph_engine = eager_and_graph_model
    prompts, max_tokens = tiny_prompts
    tol, top_k = limits_for("float32").logprobs
    limit = limits_for("float32").graph_divergences
    eager = eager_completions

    good, decoder = _decode(graph_engine, device, prompts, max_tokens, top_k)
    report = perf.graph_eager_parity(good, eager, tol, limit)
    assert report.ok, report.problems
    assert decoder.replays == len(prompts) * (max_tokens - 1)

    short = [i for i, p in enumerate(prompts) if len(p) <= 129]  # 5, 127 and 129 tokens: the window's edge
    for fault in graph_decode.FAULTS:
        broken, _ = _decode(graph_engine, device, [prompts[i] for i in short], max_tokens, top_k, fault=fault)
        bad = perf.graph_eager_parity(broken, [eager[i] for i in short], tol, limit)
        assert not bad.ok and any("graph mode chose" in problem for problem in bad.problems), (fault, bad.problems)


def test_engine_static_decode_matches_recompute(tiny: TinyModel, eager_completions, tiny_prompts, device):
    """enforce_eager=True is the graph check's eager side for transformers: the static cache, no graph."""
    static = TransformersEngine(str(tiny.path), {"dtype": "float32", "device": device, "enforce_eager": True})
    assert static.info()["backends"]["decode"] == "static"
    prompts, max_tokens = tiny_prompts
    tol, top_k = limits_for("float32").logprobs
    report = perf.graph_eager_parity(static.generate_greedy(prompts, max_tokens, top_k, prompt_logprobs=True),
                                     eager_completions, tol, 0)
    assert report.ok, report.problems


def test_capture_needs_a_gpu_and_faults_are_known(eager_and_graph_model):
    _, graph_engine = eager_and_graph_model
    with pytest.raises(ValueError, match="unknown graph-mode fault"):
        graph_decode.GraphDecoder(graph_engine.model, "cpu", 8, fault="typo", capture=False)
    if not GPU:
        with pytest.raises(ValueError, match="needs a CUDA/HIP device"):
            graph_decode.GraphDecoder(graph_engine.model, "cpu", 8)


def test_capture_log_in_data_is_the_one_the_decoder_writes():
    for target in ("cuda", "rocm"):
        assert perf.graph_capability(target, "transformers").capture_log == graph_decode.CAPTURE_LOG
