"""Controls of conformance/checks/test_quantized.py: its own bodies against a truncated shard, loaders that read
GPTQ's or MXFP4's nibbles the wrong way round, an engine under test without the format's loader and an internal
crash that mentions ImportError."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from conformance.checkpoints.quant.checkpoint import dequantized_copy, quantized
from conformance.checks import test_quantized as quantized_checks
from conformance.engines.worker import EngineError
from conformance.reference import Reference
from tests.check_fakes import FAILED, Figures, ScriptedEngine, ScriptedEngines, target_of


def test_model_quantization_check_fails_on_a_truncated_shard(tmp_path):
    bad = tmp_path / "truncated"
    shutil.copytree(quantized("gptq"), bad)
    shard = bad / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4096])
    with pytest.raises(FAILED, match="truncated"):
        quantized_checks.test_model_quantization_is_well_formed(SimpleNamespace(path=bad), Figures())


def misreading_engine(reference_dir, misread: str | None, tmp_path, methods: dict) -> ScriptedEngines:
    """An engine whose loader reads the checkpoint wrongly: its logprobs are the fp64 scores of the misread weights."""
    ref = Reference(dequantized_copy(reference_dir, tmp_path / "misread", misread=misread) if misread
                    else reference_dir)

    def generate(prompts, max_tokens, top_k, prompt_logprobs=False):
        return [ref.score(p, [], top_k) for p in prompts]  # prefill logprobs of the misread weights
    engine = ScriptedEngine({"components:quant_methods": methods, "generate_greedy": generate})
    return ScriptedEngines(engine, by_key=lambda o: engine)


def test_quantized_check_fails_on_a_loader_that_reverses_gptq_nibbles(tmp_path, tiny_prompts):
    methods = {"model.layers.0.attn.qkv_proj": "AutoGPTQLinearMethod/CPUWNA16LinearKernel",
               "model.layers.0.attn.o_proj": "AutoGPTQLinearMethod/CPUWNA16LinearKernel"}
    engines = misreading_engine(quantized("gptq"), "gptq_nibbles_reversed", tmp_path, methods)
    prompts = SimpleNamespace(prompts=[p[:24] for p in tiny_prompts[0]], max_tokens=2)
    with pytest.raises(FAILED, match="exceeds the tolerance"):
        quantized_checks.test_quantized_checkpoint_matches_reference("gptq", "under-test", engines, target_of(),
                                                                     prompts, 1.0, Figures())


def test_quantized_check_fails_when_the_transformers_engine_under_test_lacks_a_loader(tmp_path, tiny_prompts):
    """Fail-open closed: an ImportError of the engine UNDER TEST is a failure, not a 'capability absent' skip."""
    class NoLoader(ScriptedEngine):
        def call(self, method, *args, **kwargs):
            raise EngineError("Traceback ...\nImportError: Loading a GPTQ model requires optimum")
    engines = ScriptedEngines(NoLoader(), by_key=lambda o: NoLoader())
    prompts = SimpleNamespace(prompts=[p[:24] for p in tiny_prompts[0]], max_tokens=2)
    with pytest.raises(FAILED, match="requires optimum"):
        quantized_checks.test_quantized_checkpoint_matches_reference("gptq", "under-test", engines,
                                                                     target_of(engine="transformers"), prompts, 1.0,
                                                                     Figures())
    with pytest.raises(pytest.skip.Exception, match="capability absent"):  # the helper engine: named, skipped
        quantized_checks.test_quantized_checkpoint_matches_reference("gptq", "transformers", engines, target_of(),
                                                                     prompts, 1.0, Figures())


def test_quantized_check_fails_on_an_internal_crash_that_mentions_importerror(tiny_prompts):
    class Crash(ScriptedEngine):
        def call(self, method, *args, **kwargs):
            raise EngineError("Traceback ...\n  ImportError was handled here\nRuntimeError: CUDA error: illegal access")
    engines = ScriptedEngines(Crash(), by_key=lambda o: Crash())
    prompts = SimpleNamespace(prompts=[p[:24] for p in tiny_prompts[0]], max_tokens=2)
    with pytest.raises(FAILED, match="illegal access"):
        quantized_checks.test_quantized_checkpoint_matches_reference("gptq", "transformers", engines, target_of(),
                                                                     prompts, 1.0, Figures())


def test_mxfp4_check_fails_on_a_loader_that_swaps_nibbles(tmp_path, tiny_prompts, monkeypatch):
    from safetensors.torch import load_file, save_file

    from conformance.checkpoints.crafted import mxfp4

    src = mxfp4()
    bad = tmp_path / "nibbles_swapped"
    shutil.copytree(src, bad)
    w = load_file(str(src / "model.safetensors"))
    for name in [n for n in w if n.endswith("_blocks")]:
        w[name] = ((w[name] & 0x0F) << 4) | (w[name] >> 4)
    save_file(w, str(bad / "model.safetensors"))
    methods = {"model.layers.0.mlp.experts": "Mxfp4MoEMethod"}
    engines = misreading_engine(bad, None, tmp_path, methods)
    prompts = SimpleNamespace(prompts=[p[:24] for p in tiny_prompts[0]], max_tokens=2)
    with pytest.raises(FAILED, match="exceeds the tolerance|not applied|chose"):
        quantized_checks.test_mxfp4_checkpoint_matches_reference("under-test", engines, target_of(), prompts, 1.0,
                                                                 Figures())
