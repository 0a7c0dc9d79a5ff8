"""The fp64 reference on a device (conformance/reference/device.py): on device "cpu" it is the CPU reference exactly,
and its CPU spot checks catch a device whose results are off, per layer and in the head."""

from __future__ import annotations

import json
import re

import pytest
import torch

from conformance.reference import device
from conformance.reference.device import DeviceMismatch, DeviceReference, reference_for
from conformance.reference.gpt_oss import Reference
from conformance.run import run_target

IDS = [7, 3, 91, 15, 40, 2, 66, 18, 5, 120, 33, 9, 71, 48, 12, 100, 27, 8]


def test_device_path_on_cpu_is_the_cpu_reference(tiny, reference, tiny_prompts):
    on_device = DeviceReference(tiny.path, device="cpu")
    assert torch.equal(on_device.logprobs(IDS), reference.logprobs(IDS))
    prompts, max_tokens = tiny_prompts
    assert on_device.generate_greedy(prompts[:2], 3, 5) == reference.generate_greedy(prompts[:2], 3, 5)
    assert 0 < on_device.worst_rel < device.SPOT_RTOL / 1000, "the CPU recomputation differs only in rounding"


def test_a_device_reference_says_where_its_time_goes(tiny, monkeypatch):
    """The split `reference: device` / `CPU checks` / `CPU checks waited` (run phases): a scored path's layers add to
    the device's time and, in the worker thread beside it, to the CPU checks'; a per-layer block (the layer check's)
    waits for its CPU rows in full."""
    spent = dict.fromkeys(device.SPENT, 0.0)
    monkeypatch.setattr(device, "SPENT", spent)
    ref = DeviceReference(tiny.path, device="cpu")
    ref.logprobs(IDS)
    assert spent["device"] > 0 and spent["CPU checks"] > 0 and 0 < spent["CPU checks waited"]
    before = dict(spent)
    x = torch.randn(len(IDS), int(ref.cfg["hidden_size"]), dtype=torch.float64)
    ref.moe(0, x)
    grew = {k: spent[k] - before[k] for k in spent}
    assert grew["device"] > 0 and grew["CPU checks"] > 0
    assert grew["CPU checks"] == pytest.approx(grew["CPU checks waited"])


def test_the_device_s_time_splits_into_weights_read_and_dequantize(tiny_prompts, monkeypatch):
    """An H100 on 2026-12-05 ran the device reference at 5.5 s a layer, and its record could not say how much of it
    was reading the checkpoint and widening MXFP4 experts: the device store's own reads and dequantizations are now
    `reference: device weights read` and `device dequantize`, parts of `device` (a store on "cpu" stands in: on a GPU
    each is timed by events on the device's timeline, adding no synchronisation)."""
    from conformance.checkpoints.crafted import mxfp4

    spent = dict.fromkeys(device.SPENT, 0.0)
    monkeypatch.setattr(device, "SPENT", spent)
    ref = DeviceReference(mxfp4(), streaming=True, device="cpu")
    ref.logprobs(tiny_prompts[0][0][:24])
    assert 0 < spent["device dequantize"] and 0 < spent["device weights read"]
    assert spent["device weights read"] + spent["device dequantize"] < spent["device"]
    # the experts' slices are a part of the weights read (measured on an H100 on 2026-12-06: which part, on a GPU)
    assert 0 < spent["device expert slices read"] < spent["device weights read"]
    assert ref.on_device.w.spent == {"weights read": 0.0, "expert slices read": 0.0, "dequantize": 0.0}, \
        "moved into SPENT"
    assert ref.checker.w.spent["dequantize"] > 0, "the CPU's spot rows keep theirs: not the device's"


class ShiftedLayer(Reference):
    """A "device" whose layer `layer` comes out `delta` (relative to the row's largest entry) off at one entry."""

    def __init__(self, model_dir, layer: int, position: int, column: int, delta: float) -> None:
        super().__init__(model_dir, streaming=True)
        self.at, self.delta = (layer, position, column), delta

    def layer(self, i, x, cos, sin):
        out = super().layer(i, x, cos, sin)
        layer, position, column = self.at
        if i == layer:
            out[position, column] += self.delta * out[position].abs().max()
        return out


@pytest.mark.parametrize("delta", [1e-8, float("nan")])
def test_a_layer_off_on_the_device_is_caught(tiny, delta):
    ref = DeviceReference(tiny.path, device="cpu")
    last = len(IDS) - 1  # the last position is checked at every layer
    ref.on_device = ShiftedLayer(tiny.path, layer=2, position=last, column=5, delta=delta)
    with pytest.raises(DeviceMismatch, match=rf"^layer 2: .* at position {last}, hidden 5, .*not trusted\.$"):
        ref.logprobs(IDS)


class Float32Device(Reference):
    """A "device" whose layers round their results through fp32 (reduced-precision matmuls or accumulation)."""

    def layer(self, i, x, cos, sin):
        return super().layer(i, x, cos, sin).float().double()


def test_a_device_that_rounds_through_fp32_is_caught(tiny):
    ref = DeviceReference(tiny.path, device="cpu")
    ref.on_device = Float32Device(tiny.path, streaming=True)
    with pytest.raises(DeviceMismatch, match=r"^layer 0: the device's fp64 gives"):
        ref.logprobs(IDS)


class ShiftedHead(Reference):
    def head(self, x):
        out = super().head(x)
        out[-1, 11] += 1e-7
        return out


def test_a_head_off_on_the_device_is_caught(tiny):
    ref = DeviceReference(tiny.path, device="cpu")
    ref.on_device = ShiftedHead(tiny.path, streaming=True)
    with pytest.raises(DeviceMismatch, match=rf"^the final norm and lm_head: .* position {len(IDS) - 1}, token 11,"):
        ref.logprobs(IDS)


def test_the_target_names_the_reference_device(tiny):
    table = run_target.data()
    assert "reference_device" not in table["cpu"], "the CPU default keeps the CPU reference"
    assert type(reference_for(tiny.path, False, table["cpu"].get("reference_device"))) is Reference
    for gpu in ("cuda", "rocm"):
        assert table[gpu]["reference_device"] == "cuda"  # torch names HIP devices "cuda" too
    assert isinstance(reference_for(tiny.path, False, "cpu"), DeviceReference)


def test_agreement_command_prints_figures_per_layer(tiny, capsys):
    assert device.main(["--model", str(tiny.path), "--device", "cpu", "--layers", "2", "--tokens", "12"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["0", "1"] and all(float(v) == 0.0 for r in rows for v in r[1:])
    assert "logprobs: max |Δ| 0" in out and "wall: device (cpu)" in out and "worst relative disagreement" in out
    assert "device dequantize 0.00 s" in out and "; no MXFP4 matrix" in out


def test_agreement_command_counts_the_mxfp4_matrices_it_widens(capsys):
    """On an MXFP4 checkpoint the spot-checked pass says how many expert matrices it widened on the device and
    the time of each: two a routed expert (gate_up, down), each layer."""
    from conformance.checkpoints import crafted

    model = crafted.mxfp4()
    cfg = json.loads((model / "config.json").read_text())
    widened = {}
    for paths in (1, 3):
        assert device.main(["--model", str(model), "--device", "cpu", "--tokens", "12", "--paths", str(paths)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert f"spot-checked device reference, {paths} path" in out[-2]
        line = out[-1]
        widened[paths] = int(line.split("; ")[-1].split()[0])
        assert line.endswith("ms each") and "device weights read" in line and "CPU checks" in line
    # layer by layer, every path through a layer before the next: a layer's experts are widened once for all paths
    assert 2 * cfg["num_hidden_layers"] <= widened[1] <= widened[3] <= 2 * cfg["num_hidden_layers"] * \
        cfg["num_local_experts"]


def test_agreement_command_refuses_a_folder_without_a_checkpoint(tmp_path, capsys):
    assert device.main(["--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("pass a gpt-oss checkpoint directory.") and "\n" not in err
    with pytest.raises(SystemExit) as refused:
        device.main(["--model", str(tmp_path), "--paths", "0"])
    err = capsys.readouterr().err.strip()
    assert refused.value.code == 2 and err == "--paths 0: the spot-checked pass scores at least one sequence."


def test_the_device_store_keeps_experts_only_while_the_device_has_room_and_hands_everything_back(tiny_prompts):
    """Beside an engine that took 90% of the GPU, the device's fp64 store keeps an expert only while
    DEVICE_HEADROOM stays free after it, and dequantizes the rest where they are used (the same bits); after each of
    the reference's results it holds nothing, so the next engine finds the device as free as before (a store on
    "cpu" with the device's free memory stood in, as the GPU's store reads it from torch.cuda.mem_get_info)."""
    from conformance.checkpoints.crafted import mxfp4
    from conformance.reference import gpt_oss

    path = mxfp4()
    prompt = tiny_prompts[0][0][:24]
    cpu = Reference(path, streaming=True)
    ref = DeviceReference(path, streaming=True, device="cpu")
    store = ref.on_device.w
    store.budget = None
    free = {"bytes": gpt_oss.DEVICE_HEADROOM}  # the engine left no more than the headroom
    store.device_free = lambda: free["bytes"] - store.held
    assert ref._score(prompt, [5, 9], 5) == cpu._score(prompt, [5, 9], 5)
    assert store.experts_not_kept > 0 and store.cache == {} and store.held == 0
    free["bytes"] = 2**40  # room for everything: every expert kept while the computation runs, none after it
    not_kept = store.experts_not_kept
    assert ref.generate_greedy([prompt], 2, 5) == cpu.generate_greedy([prompt], 2, 5)
    assert store.experts_not_kept == not_kept and store.cache == {} and store.held == 0


@pytest.mark.parametrize("room", [0, 2**40], ids=["no-room", "room"])
def test_the_device_store_streams_the_tables_beside_an_engine(tiny, tiny_prompts, monkeypatch, room):
    """Seen on the H200 at gpt-oss-120b's dimensions: with vLLM holding 90% of the device, the device reference
    asked for the whole lm_head in fp64 (4.6 GB) and ran out of memory. A GPU store keeps neither the embeddings
    nor lm_head in fp64: it gathers the prompt's embedding rows and widens lm_head a chunk at a time (kept as stored
    on the device only while DEVICE_HEADROOM stays free), with the CPU reference's results (a store on "cpu" set to
    stream, as a GPU store does; chunks of 7 rows, so the last is ragged)."""
    from conformance.reference import gpt_oss

    monkeypatch.setattr(gpt_oss, "HEAD_CHUNK", 7)
    prompt = tiny_prompts[0][0][:24]
    cpu = Reference(tiny.path, streaming=True)
    ref = DeviceReference(tiny.path, streaming=True, device="cpu")
    store = ref.on_device.w
    store.keeps_tables, store.budget = False, None
    assert int(cpu.cfg["vocab_size"]) % 7 != 0
    store.device_free = lambda: room + gpt_oss.DEVICE_HEADROOM - store.held
    got, want = ref.logprobs(prompt), cpu.logprobs(prompt)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert not {"model.embed_tokens.weight", "lm_head.weight"} & set(store.cache), "no table held in fp64"
    assert ("lm_head.weight#stored" in store.cache) == (room > 0), "kept as stored only where there is room"
    _same_scores(ref._score(prompt, [5, 9], 5), cpu._score(prompt, [5, 9], 5))
    assert store.cache == {} and store.held == 0


def _same_scores(got, want, atol=1e-12):
    """Two scored completions with the same tokens and top-k sets, their fp64 logprobs equal to `atol`: a chunked
    lm_head sums in another order than the whole one, and the last bits of that order are the host's BLAS's (an AMD
    EPYC host differed from the CI's in the 16th digit)."""
    assert (got.prompt_ids, got.token_ids, got.cached_tokens) == (want.prompt_ids, want.token_ids, want.cached_tokens)
    for mine, theirs in ((got.steps, want.steps), (got.prompt_steps, want.prompt_steps)):
        assert [(s.token, sorted(s.top)) for s in mine] == [(s.token, sorted(s.top)) for s in theirs]
        for a, b in zip(mine, theirs):
            assert a.top == pytest.approx(b.top, rel=0, abs=atol)


def _block_inputs(reference):
    """A prompt's normalised hidden states at layer 1's attention, and the rope tables: what the per-layer checks
    feed one block."""
    n = len(IDS)
    cos, sin = reference.rope_tables(list(range(n)))
    x = reference.layer(0, reference.embed(IDS).to(torch.float64), cos, sin)
    return x, cos, sin


def test_single_blocks_on_the_device_are_the_cpu_reference(tiny, reference):
    """#38: the per-layer checks' blocks (attention, MoE of one layer on the engine's own input) run on the device
    too; on device "cpu" they are the CPU reference's to the bit, and the spot rows agreed."""
    on_device = DeviceReference(tiny.path, device="cpu")
    x, cos, sin = _block_inputs(reference)
    assert torch.equal(on_device.attention(1, x, cos, sin), reference.attention(1, x, cos, sin))
    assert torch.equal(on_device.moe(1, x), reference.moe(1, x))
    # the per-layer check's near-ties: the MoE under another routing (the router's 5th expert for its 4th)
    k = int(reference.cfg["num_experts_per_tok"])
    top = torch.topk(reference.router_logits(1, x), k + 1, dim=-1).indices
    other = torch.cat([top[:, : k - 1], top[:, k:]], dim=-1)
    assert torch.equal(on_device.moe_routed(1, x, other), reference.moe_routed(1, x, other))
    assert torch.equal(reference.moe_routed(1, x, top[:, :k]), reference.moe(1, x))
    assert not torch.allclose(reference.moe_routed(1, x, other), reference.moe(1, x))
    assert 0 <= on_device.worst_rel < device.SPOT_RTOL / 1000


class ShiftedBlocks(Reference):
    """A "device" whose attention or MoE block of layer 1 comes out 1e-8 (of the row's largest entry) off at the last
    position: what a device rounding through fp32 or a wrong kernel would give."""

    def __init__(self, model_dir, block: str) -> None:
        super().__init__(model_dir, streaming=True)
        self.block = block

    def _shift(self, out):
        out[-1, 3] += 1e-8 * out[-1].abs().max()
        return out

    def attention(self, i, x, cos, sin):
        out = super().attention(i, x, cos, sin)
        return self._shift(out) if self.block == "attention" else out

    def moe(self, i, x):
        out = super().moe(i, x)
        return self._shift(out) if self.block == "moe" else out

    def moe_routed(self, i, x, top_idx):
        out = super().moe_routed(i, x, top_idx)
        return self._shift(out) if self.block == "moe (given routing)" else out


@pytest.mark.parametrize("beside", [False, True])
@pytest.mark.parametrize("block", ["attention", "moe", "moe (given routing)"])
def test_a_block_off_on_the_device_is_caught(tiny, reference, block, beside):
    """At once, or (`checked_beside`, the per-layer check's way) on leaving, after the blocks that ran beside its
    CPU rows: the caller had the device's result meanwhile, and the first disagreement is the one raised."""
    ref = DeviceReference(tiny.path, device="cpu")
    ref.on_device = ShiftedBlocks(tiny.path, block)
    x, cos, sin = _block_inputs(reference)
    top = torch.topk(reference.router_logits(1, x), int(reference.cfg["num_experts_per_tok"]), dim=-1).indices
    calls = {"attention": lambda r: r.attention(1, x, cos, sin), "moe": lambda r: r.moe(1, x),
             "moe (given routing)": lambda r: r.moe_routed(1, x, top)}
    where = re.escape(block)
    with pytest.raises(DeviceMismatch, match=rf"^layer 1 {where}: .* at position {len(IDS) - 1}, hidden 3, .*not "
                                             r"trusted\.$"):
        if not beside:
            calls[block](ref)
        ref.BESIDE_QUEUE = 1  # each block waits for the one before it to be checked: the queue's bound
        with ref.checked_beside():
            assert torch.equal(calls[block](ref), calls[block](ref.on_device))  # the device's result, at once
            ref.attention(0, x, cos, sin), ref.moe(0, x)  # later blocks, agreeing, still run


def test_the_noise_twin_is_the_same_reference_with_its_activations_rounded(tiny, reference):
    """Greedy parity at depth scores the engine's paths with the reference's noise twin: the same class, checkpoint
    and device, its weights and activations held in the dtype. On the device path it is the CPU twin exactly, its
    spot rows agreeing; it sits a bf16 rounding's noise away from the fp64 reference, not further."""
    from conformance.reference.device import noise_twin
    from conformance.reference.gpt_oss import Math

    on_device = noise_twin(DeviceReference(tiny.path, device="cpu"), "bfloat16")
    assert type(on_device) is DeviceReference and on_device.math.activations == "bfloat16"
    cpu = noise_twin(reference, "bfloat16")
    assert type(cpu) is Reference and cpu.math == Math(activations="bfloat16")
    twin = cpu.logprobs(IDS)
    assert torch.equal(on_device.logprobs(IDS), twin)
    assert on_device.worst_rel < device.SPOT_RTOL
    apart = float((twin - reference.logprobs(IDS)).abs().max())
    assert 1e-4 < apart < 4.0, apart  # over the whole vocabulary, its least likely tokens too (a bf16 engine: 6.7)


def test_several_paths_run_layer_by_layer_at_once_and_agree_with_one_at_a_time(tiny, reference, tiny_prompts):
    """The greedy parity check scores its prompt set's paths together: on the device they run layer-major (each
    layer's weights and experts read once for all paths; the CPU recomputes one path's spot rows a layer, in turn).
    The results are the one-at-a-time CPU reference's (to fp64 summation order), and a device layer off at one entry
    is caught on the path the CPU checks at that layer."""
    from conformance.engines.base import Completion

    prompts, _ = tiny_prompts
    paths = [Completion(p[:60], [5, 9, 11]) for p in prompts[:4]]
    on_device = DeviceReference(tiny.path, device="cpu")
    together, apart = on_device.score_all(paths, 5), [reference.score(c.prompt_ids, c.token_ids, 5) for c in paths]
    assert [c.token_ids for c in together] == [c.token_ids for c in apart]
    for got, want in zip(together, apart):
        for g, w in zip(got.prompt_steps + got.steps, want.prompt_steps + want.steps):
            assert g.top.keys() == w.top.keys() and max(abs(g.top[t] - w.top[t]) for t in g.top) < 1e-12
    assert 0 < on_device.worst_rel < device.SPOT_RTOL

    class ShiftedMany(ShiftedLayer):
        def layer_many(self, i, xs, tables):
            out = Reference.layer_many(self, i, xs, tables)
            layer, position, column = self.at
            if i == layer:
                x = out[layer % len(out)]  # the path the CPU checks at this layer
                x[position, column] += self.delta * x[position].abs().max()
            return out

    bad = DeviceReference(tiny.path, device="cpu")
    last = len(paths[2].prompt_ids) + len(paths[2].token_ids) - 2  # the last position of path 2's sequence
    bad.on_device = ShiftedMany(tiny.path, layer=2, position=last, column=5, delta=1e-8)
    with pytest.raises(DeviceMismatch, match=rf"^layer 2 \(path 2\): .* at position {last}, hidden 5,"):
        bad.score_all(paths, 5)


def test_tied_router_logits_route_to_the_lower_expert_on_every_device(tiny):
    """The noise twin rounds router logits to bf16, where a tie at the k-th place is common; the device's fp64 and the
    CPU's must break it alike, or the spot check sees two different experts' outputs (the DeviceMismatch on an H100
    on 2026-12-05). top_experts puts the lower index first; the reference's MoE routes by it."""
    from conformance.reference.gpt_oss import top_experts

    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0, 0.5], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    assert top_experts(logits, 3).tolist() == [[1, 3, 2], [0, 1, 2]]
    ref = Reference(tiny.path)
    k, n = int(ref.cfg["num_experts_per_tok"]), int(ref.cfg["num_local_experts"])
    x = torch.randn(2, int(ref.cfg["hidden_size"]), dtype=torch.float64)
    tied = torch.zeros(2, n, dtype=torch.float64)  # every expert tied: the first k must take the row
    ref.router_logits = lambda i, x: tied
    by_index = ref.moe_routed(0, x, torch.arange(k).expand(2, k))
    assert torch.equal(ref.moe(0, x), by_index)
    assert not torch.allclose(ref.moe_routed(0, x, torch.arange(n - k, n).expand(2, k)), by_index)


def test_a_device_out_of_memory_beside_the_engine_is_one_sentence(tiny, monkeypatch):
    """On 2026-12-05, beside an engine holding 0.95 of an H100, the reference's layer ran out of device memory and the
    check failed with torch's paragraph. It is now a DeviceOutOfMemory naming the layer and what to change, and the
    store holds nothing after it."""
    ref = DeviceReference(tiny.path, device="cpu")

    def no_room(*args, **kwargs):
        ref.on_device.w.cache["held"] = torch.zeros(1)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 360.00 MiB.")

    monkeypatch.setattr(ref.on_device, "layer", no_room)
    with pytest.raises(device.DeviceOutOfMemory, match=r"during layer 0: .*gpu_memory_utilization"):
        ref.logprobs(IDS)
    assert not ref.on_device.w.cache
    monkeypatch.setattr(ref.on_device, "moe", no_room)
    with pytest.raises(device.DeviceOutOfMemory, match="during layer 1 moe"):
        ref.moe(1, torch.zeros(3, int(ref.cfg["hidden_size"]), dtype=torch.float64))


def test_the_reads_command_times_the_store_s_own_reads_and_the_other_ways(capsys, monkeypatch):
    """`python -m conformance.reference.reads` (#38: reading the weights is the device reference's largest part on the
    H200) times WeightStore._slice itself over every expert and tensor of the layer, beside the other ways, with
    median/min/max; pinned buffers only where the device is a GPU; bad input gets one sentence."""
    from conformance.checkpoints.crafted import mxfp4
    from conformance.reference import reads
    from conformance.reference.gpt_oss import WeightStore

    model = mxfp4()
    calls = []
    real = WeightStore._slice
    monkeypatch.setattr(WeightStore, "_slice", lambda self, name, e: calls.append((name, e)) or real(self, name, e))
    assert reads.main(["--model", str(model), "--device", "cpu", "--repeats", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("layer 0: 6 expert tensors, ") and out[0].endswith("onto cpu, 2 reads each")
    assert [line.split("  median")[0].strip() for line in out[1:]] == [
        "the store's (each expert's slices)", "each expert's slices copied on the host", "the layer's whole tensors"]
    assert all(re.search(r"median +[0-9.]+ s +min +[0-9.]+ s +max +[0-9.]+ s +[0-9.]+ GB/s$", line) for line in out[1:])
    experts = json.loads((model / "config.json").read_text())["num_local_experts"]
    assert len(calls) == 2 * experts * 6 and {name.rsplit(".", 1)[1] for name, _ in calls} == {
        "gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales", "gate_up_proj_bias",
        "down_proj_bias"}
    assert reads.main(["--model", str(model), "--device", "cpu", "--layer", "99"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("holds no expert tensors of layer 99: pass a gpt-oss checkpoint directory and one of its "
                        "layers.") and "\n" not in err
    with pytest.raises(SystemExit):
        reads.main(["--model", str(model), "--repeats", "0"])
    assert capsys.readouterr().err.strip() == "--repeats 0: each way is read at least once."


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned host buffers are a GPU store's way of reading")
def test_a_gpu_store_s_pinned_reads_hold_each_expert_s_own_bytes_while_the_device_lags():
    """A GPU store reads expert slices through pinned buffers it reuses, copying without blocking (round
    twenty-five). With the device's stream kept busy, every slice read back to back must still hold its own
    expert's bytes: a buffer refilled before its last copy ran would hand one expert another's weights."""
    from conformance.checkpoints.crafted import mxfp4
    from conformance.reference import reads
    from conformance.reference.gpt_oss import WeightStore

    store = WeightStore(mxfp4(), device="cuda")
    names = reads.expert_tensors(store, 0)
    experts = int(store.where[names[0]].get_slice(names[0]).get_shape()[0])
    torch.cuda._sleep(2_000_000_000)  # ~1 s of the device's stream before the copies queue behind it
    got = [(name, e, store._slice(name, e)) for e in range(experts) for name in names]
    assert store._staging, "the pinned way was taken"
    for name, e, t in got:
        assert torch.equal(t.cpu(), store.where[name].get_slice(name)[e]), f"{name}[{e}]"
    store.release()
    assert not store._staging
