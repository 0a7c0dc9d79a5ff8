"""Self-tests of the GPTQ, AWQ and FP8 writers: packing proven on known words, every writer round-trips through
the suite's independent unpackers to the quantized integers, dequantizes to the known weights within the
format's step, agrees with the real tools' own code where it is installed (compressed-tensors' quantize,
vLLM's unpackers and AWQ-to-GPTQ conversion, in a child process), and a planted writer bug is caught."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import textwrap

import pytest
import torch

from conformance.checkpoints.models import TinySpec, _weights
from conformance.checkpoints.quant import awq, fp8, gptq, int4
from conformance.checkpoints.quant.checkpoint import (
    dequantized_copy,
    dequantized_weights,
    known_weights_match,
    quantized,
    write_quantized_checkpoint,
)
from conformance.checkpoints.quant.formats import FORMATS, WRITER_BUGS
from conformance.checkpoints.quant.validate import validate
from conformance.engines import forkserver
from conformance.run import run_target


def _weight(out: int = 64, k: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randn(out, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 0.1


def _as_u32(t: torch.Tensor) -> list[int]:
    return [int(v) & 0xFFFFFFFF for v in t.flatten().tolist()]


def test_int4_words_follow_each_tools_slot_order():
    values = torch.arange(8)[None]  # one row of 8 logical elements 0..7
    assert _as_u32(int4.pack(values, dim=1, order=int4.GPTQ_ORDER)) == [0x76543210]
    assert _as_u32(int4.pack(values, dim=1, order=int4.AWQ_ORDER)) == [0x75316420]  # slots hold 0,2,4,6,1,3,5,7
    top = torch.full((1, 8), 15)
    assert int4.pack(top, dim=1).dtype == torch.int32 and _as_u32(int4.pack(top, dim=1)) == [0xFFFFFFFF]


@pytest.mark.parametrize("order", [int4.GPTQ_ORDER, int4.AWQ_ORDER])
@pytest.mark.parametrize("dim", [0, 1])
def test_int4_unpack_inverts_pack(order, dim):
    values = torch.randint(0, 16, (32, 48), generator=torch.Generator().manual_seed(1))
    assert torch.equal(int4.unpack(int4.pack(values, dim, order), dim, order), values)
    assert not torch.equal(int4.unpack(int4.pack(values, dim, int4.AWQ_ORDER), dim, int4.GPTQ_ORDER), values)


def test_gptq_layout_shapes_zero_convention_and_g_idx():
    gq = gptq.quantize(_weight(), group_size=32)
    t = gptq.pack(gq)
    assert t["qweight"].shape == (128 // 8, 64) and t["qweight"].dtype == torch.int32
    assert t["qzeros"].shape == (128 // 32, 64 // 8) and t["scales"].shape == (4, 64)
    assert t["scales"].dtype == torch.float16 and torch.equal(t["g_idx"], (torch.arange(128) // 32).int())
    assert set(_as_u32(t["qzeros"])) == {0x77777777}  # v1 stores zero - 1 = 7 in every nibble
    assert set(_as_u32(gptq.pack(gq, "gptq_v2")["qzeros"])) == {0x88888888}
    for fmt_name in ("gptq", "gptq_v2"):
        q, zeros = gptq.unpack(gptq.pack(gq, fmt_name), fmt_name)
        assert torch.equal(q, gq.q) and torch.equal(zeros, gq.zeros) and bool((zeros == 8).all())


def test_gptq_dequantizes_within_half_a_step_and_reads_act_order_through_g_idx():
    w = _weight()
    gq = gptq.quantize(w, 32)
    t = gptq.pack(gq)
    deq = gptq.dequantize(t)
    assert torch.equal(deq, gq.dequantized())
    assert ((deq - w).abs() <= FORMATS["gptq"].step_bound(w, t)).all()
    perm = torch.randperm(128, generator=torch.Generator().manual_seed(2))  # desc_act: columns in any group order
    shuffled = t | {"g_idx": t["g_idx"][perm]}
    q = gq.q[:, perm]
    permuted = shuffled | {"qweight": int4.pack(q.T, 0)}
    assert torch.equal(gptq.dequantize(permuted), deq[:, perm])


def test_awq_layout_shapes_zeros_and_round_trip():
    w = _weight()
    gq = awq.quantize(w, 32)
    t = awq.pack(gq)
    assert t["qweight"].shape == (128, 64 // 8) and t["qzeros"].shape == (4, 64 // 8) and "g_idx" not in t
    q, zeros = awq.unpack(t)
    assert torch.equal(q, gq.q) and torch.equal(zeros, gq.zeros)
    assert bool((zeros > 0).all() and (zeros < 15).all())  # asymmetric: real zero points, no "-1"
    deq = awq.dequantize(t)
    assert torch.equal(deq, gq.dequantized())
    assert ((deq - w).abs() <= FORMATS["awq"].step_bound(w, t)).all()


@pytest.mark.parametrize("strategy", fp8.STRATEGIES)
def test_fp8_scale_shapes_and_half_ulp_error(strategy):
    w = _weight()
    t = fp8.quantize(w, strategy)
    assert t["weight"].dtype == torch.float8_e4m3fn
    assert t["weight_scale"].shape == ((64, 1) if strategy == "channel" else (1,))
    assert t["weight"].float().abs().max().item() <= fp8.E4M3_MAX
    bound = FORMATS[f"fp8-{strategy}"].step_bound(w, t)
    assert ((fp8.dequantize(t) - w).abs() <= bound).all()


def test_fp8_quantizer_is_bit_identical_to_compressed_tensors():
    ct = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward")
    from compressed_tensors.quantization import QuantizationArgs

    w = _weight().float()
    mine = fp8.quantize(w, "channel", scale_dtype=torch.float32)
    args = QuantizationArgs(num_bits=8, type="float", strategy="channel", symmetric=True)
    theirs = ct.quantize(w, mine["weight_scale"], torch.zeros_like(mine["weight_scale"]), args,
                         dtype=torch.float8_e4m3fn)
    assert torch.equal(theirs.view(torch.uint8), mine["weight"].view(torch.uint8))


def test_fp8_config_parses_as_a_compressed_tensors_config():
    cfg = pytest.importorskip("compressed_tensors.quantization")
    for strategy in fp8.STRATEGIES:
        parsed = cfg.QuantizationConfig.model_validate(fp8.config(strategy, ["lm_head"]))
        assert parsed.config_groups["group_0"].weights.strategy == strategy
        assert parsed.config_groups["group_0"].input_activations.dynamic is True


VLLM_UNPACK = textwrap.dedent("""
    import json, sys, torch
    import vllm.model_executor.parameter as vllm_parameter  # a forked child of its own: the patch dies with it
    vllm_parameter.get_tensor_model_parallel_rank = lambda: 0  # one process, no parallel groups
    vllm_parameter.get_tensor_model_parallel_world_size = lambda: 1
    from vllm.model_executor.layers.quantization.auto_awq import _convert_awq_to_standard_format
    from vllm.model_executor.layers.quantization.utils.quant_utils import unpack_quantized_values_into_int32
    from vllm.scalar_type import scalar_types
    d = json.load(sys.stdin)
    gptq_q = unpack_quantized_values_into_int32(torch.tensor(d["gptq"], dtype=torch.int32), scalar_types.uint4b8, 0)
    layer = torch.nn.Module()
    layer.qweight = torch.nn.Parameter(torch.tensor(d["awq_w"], dtype=torch.int32), requires_grad=False)
    layer.qzeros = torch.nn.Parameter(torch.tensor(d["awq_z"], dtype=torch.int32), requires_grad=False)
    _convert_awq_to_standard_format(layer, "qweight", "qzeros", 4)
    awq_q = unpack_quantized_values_into_int32(layer.qweight.data, scalar_types.uint4, 0)
    awq_z = unpack_quantized_values_into_int32(layer.qzeros.data, scalar_types.uint4, 0)
    print(json.dumps({"gptq": gptq_q.tolist(), "awq": awq_q.tolist(), "awq_z": awq_z.tolist()}))
""")


def _run_printing(code: str, stdin: str) -> str:
    """Run `code` with `stdin` as its standard input; what it printed last."""
    out = io.StringIO()
    sys.stdin = io.StringIO(stdin)
    with contextlib.redirect_stdout(out):
        exec(code, {"__name__": "__main__"})  # noqa: S102 - the test's own code, in a child process
    return out.getvalue().strip().splitlines()[-1]


def test_packing_matches_what_vllm_unpacks():
    """vLLM's own unpacker (GPTQ) and AWQ-to-GPTQ conversion read the suite's words as the integers written."""
    pytest.importorskip("vllm")
    w = _weight()
    g, a = gptq.quantize(w, 32), awq.quantize(w, 32)
    tg, ta = gptq.pack(g), awq.pack(a)
    payload = json.dumps({"gptq": tg["qweight"].tolist(), "awq_w": ta["qweight"].tolist(),
                          "awq_z": ta["qzeros"].tolist()})
    # in a child of the tests' forkserver, which has imported vLLM for the CPU target already
    with forkserver.context(run_target.data()["cpu"]["env"]).Pool(1) as pool:
        got = json.loads(pool.apply_async(_run_printing, (VLLM_UNPACK, payload)).get(timeout=300))
    assert torch.equal(torch.tensor(got["gptq"]), g.q.T)  # [in, out]
    assert torch.equal(torch.tensor(got["awq"]), a.q.T)
    assert torch.equal(torch.tensor(got["awq_z"]), a.zeros.T)  # [out, groups] after vLLM's transpose


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_written_checkpoint_validates_and_matches_the_known_weights(fmt, tmp_path):
    path = quantized(fmt, root=tmp_path)
    found = validate(path)
    assert len(found.quantized_modules) == 4 * TinySpec().num_hidden_layers
    report = known_weights_match(path)
    assert report.ok, report.problems
    assert 0.5 < report.measured["max_weight_error_in_steps"] <= 1.0  # the step bound is tight, not loose
    plain = dequantized_copy(path)
    from safetensors.torch import load_file

    stored = load_file(str(plain / "model.safetensors"))
    deq = dequantized_weights(path)
    assert set(stored) == set(deq) and all(torch.equal(stored[k], deq[k]) for k in deq)
    assert set(deq) == set(_weights(TinySpec()))  # the plain copy has exactly the HF names of the model


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_known_weights_step_catches_a_planted_writer_bug(fmt, tmp_path):
    """Nibbles reversed (GPTQ), AWQ's interleave replaced by the plain order, FP8 scales inverted: the
    checkpoint is still well formed, so only the comparison with the known weights can see it."""
    bad = write_quantized_checkpoint(fmt, TinySpec(), tmp_path / "bad", bug=WRITER_BUGS[fmt])
    validate(bad)
    report = known_weights_match(bad)
    assert not report.ok and report.measured["max_weight_error_in_steps"] > 2.0


@pytest.mark.parametrize("fmt", ["gptq", "awq", "fp8-tensor"])
def test_weightstore_hook_reads_the_quantized_file_as_the_dequantized_copy(fmt, monkeypatch, tiny_prompts):
    """The 3-line hook proposed for reference.gpt_oss.WeightStore (conformance/checkpoints/quant/hook.py) gives the
    reference
    the numbers of the dequantized plain copy the checks use today (to fp64 rounding)."""
    from conformance.checkpoints.quant.hook import linear_weight
    from conformance.reference import Reference
    from conformance.reference.gpt_oss import WeightStore

    plain = WeightStore.__getitem__

    def hooked(self: WeightStore, name: str) -> torch.Tensor:
        if name not in self.cache and (deq := linear_weight(self.where, name)) is not None:
            self.cache[name] = deq
        return plain(self, name)

    path = quantized(fmt)
    prompt = tiny_prompts[0][1]
    want = Reference(dequantized_copy(path)).logprobs(prompt)
    monkeypatch.setattr(WeightStore, "__getitem__", hooked)
    assert (Reference(path).logprobs(prompt) - want).abs().max().item() < 1e-9  # fp64 summation order only
