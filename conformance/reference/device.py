"""The fp64 reference on a torch device, checked against the CPU as it goes.

The CPU reference takes minutes per sequence at gpt-oss-120b's size; H200 and MI300X run fp64 matmuls at tens of
TFLOP/s. `DeviceReference` runs the same formulas (gpt_oss.py: the `Reference` methods, on a weight store that moves
tensors to the device) layer by layer, one layer's weights and routed experts resident at a time (MXFP4 blocks are
dequantized on the device), and does not trust the device it judges: after each layer, and after the final norm and
lm_head, a few positions (the last one and SPOT_ROWS drawn ones) are recomputed on the CPU in fp64 from the device's
own input to that layer, and every entry of those rows must agree within SPOT_RTOL of the row's largest magnitude.
fp64 on two devices differs only in summation order (about 1e-14 of a row here); a device that rounds through fp32 or
tf32 differs by 1e-8 or more. A disagreement is a `DeviceMismatch`, one sentence naming the layer and the entry.

The run's target names the device (`reference_device` in data/targets.toml); without one the CPU reference runs.

`python -m conformance.reference.device --model DIR [--layers N]` prints the agreement of device and CPU fp64 per
layer on a sampled sequence, and the wall time of each (no engine, no server: torch, numpy and safetensors only).
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from conformance.engines.base import Completion
from conformance.reference.gpt_oss import Math, Reference, scored
from conformance.reference.longref import LongReference

SPOT_ROWS = 2  # positions per layer recomputed on the CPU besides the last (which sees the most keys)
SPOT_RTOL = 1e-10  # |device - CPU| allowed per entry, relative to the largest |CPU| entry of its row
# Where a device reference's time goes, summed over every DeviceReference of the process (the run's phases
# "reference: device", "reference: CPU checks", "reference: CPU checks waited"; run/fixtures.py): the device's work
# (reading and dequantizing weights, computing, fetching the rows to check); the CPU's fp64 spot rows, which a scored
# path's layers recompute in a worker thread beside the device's next layer; and the time the device's side waited
# for them. At gpt-oss-120b's dimensions the reference took 5.5 s a layer on the H200 (2026-12-05) while the
# device alone ran a 2-layer sequence in 2.4 s and the spot-checked reference, checking in turn, in 8.9 s.
# Of the device's work, "device weights read" (of it, "device expert slices read") and "device dequantize" are the
# device store's own (WeightStore.spent).
SPENT: dict[str, float] = {"device": 0.0, "device weights read": 0.0, "device expert slices read": 0.0,
                           "device dequantize": 0.0, "CPU checks": 0.0, "CPU checks waited": 0.0}


def _spent(since: float, *what: str) -> float:
    """Add the seconds since `since` to each of `what`; now."""
    now = time.perf_counter()
    for name in what:
        SPENT[name] += now - since
    return now


def _collect(store: Any) -> None:
    """Move what a device store spent reading and dequantizing into SPENT."""
    for what, seconds in store.settle().items():
        SPENT[f"device {what}"] += seconds
        store.spent[what] = 0.0


class DeviceMismatch(RuntimeError):
    """The device's fp64 disagrees with the CPU's on a spot-checked entry."""


def spot_rows(n: int, layer: int) -> torch.Tensor:
    """The positions of an n-token sequence that layer `layer` is checked at: the last and SPOT_ROWS drawn ones,
    drawn afresh per layer (the same for the same n and layer, so a failure repeats)."""
    drawn = random.Random(f"{n}:{layer}").sample(range(n), min(SPOT_ROWS, n))
    return torch.tensor(sorted({n - 1, *drawn}))


def check_agreement(where: str, got: torch.Tensor, want: torch.Tensor, rows: torch.Tensor, column: str) -> float:
    """The worst |got - want| relative to the largest |want| of its row; DeviceMismatch beyond SPOT_RTOL."""
    scale = want.abs().amax(dim=-1, keepdim=True).clamp(min=torch.finfo(torch.float64).tiny)
    err = torch.nan_to_num((got - want).abs() / scale, nan=float("inf"))
    worst = int(err.argmax())
    r, j = divmod(worst, err.shape[-1])
    rel = float(err[r, j])
    if not rel <= SPOT_RTOL:
        raise DeviceMismatch(f"{where}: the device's fp64 gives {float(got[r, j]):.17g} at position "
                             f"{int(rows[r])}, {column} {j}, the CPU's {float(want[r, j]):.17g} (|Δ| {rel:.3g} of the "
                             f"row's largest {float(scale[r]):.3g}, allowed {SPOT_RTOL:g}): the device is not trusted.")
    return rel


class DeviceOutOfMemory(RuntimeError):
    """The device had too little memory free beside the engine for the reference's layer."""


@contextmanager
def room_on(store, what: str) -> Iterator[None]:
    """Turn the device running out of memory during `what` into one sentence, the store's tensors released."""
    try:
        yield
    except torch.OutOfMemoryError:
        store.release()
        free = (f" ({torch.cuda.mem_get_info(store.device)[0] / 2**30:.2f} GiB free now)"
                if store.device.type == "cuda" else "")
        raise DeviceOutOfMemory(
            f"the fp64 reference ran out of memory on {store.device} during {what}{free}: it needs a few GB free "
            "beside the engine; give the engine a smaller gpu_memory_utilization (data/profiles.toml) or run the "
            "reference on the CPU (no reference_device in data/targets.toml)") from None


class DeviceReference(Reference):
    """`Reference` whose `logprobs` (so `score` and `generate_greedy`) and single blocks (`attention`, `moe`: the
    per-layer checks) run on `device`, spot-checked on the CPU. `router_logits` (one small matmul) stays on the CPU."""

    def __init__(self, model_dir: Path | str, math_: Math | str | None = None, streaming: bool = False,
                 device: str = "cpu") -> None:
        super().__init__(model_dir, math_, streaming)
        self.on_device = Reference(model_dir, self.math, streaming=True, device=device)
        self.checker = LongReference(model_dir, self.math, streaming=True)  # recomputes chosen positions only
        self.worst_rel = 0.0  # the largest relative disagreement the spot checks saw (figures for the record)

    def _checked(self, where: str, got: torch.Tensor, want: torch.Tensor, rows: torch.Tensor, column: str) -> None:
        self.worst_rel = max(self.worst_rel, check_agreement(where, got.cpu(), want, rows, column))

    # After each of the reference's results (a scored path, a greedy generation: many logprobs calls) the device
    # holds none of its tensors: an engine started next measures the device's free memory and takes its share of it.
    def _score(self, prompt: list[int], continuation: list[int], top_k: int) -> Completion:
        try:
            return super()._score(prompt, continuation, top_k)
        finally:
            self.on_device.w.release()

    def generate_greedy(self, prompts: list[list[int]], max_tokens: int, top_k: int) -> list[Completion]:
        try:
            return super().generate_greedy(prompts, max_tokens, top_k)
        finally:
            self.on_device.w.release()

    # Several paths at once (the greedy parity check scores the prompt set's 8): layer by layer, every path through a
    # layer before the next, so each layer's weights and routed experts reach the device once, not once a path; the
    # CPU recomputes the spot rows of one path a layer, in turn (at 120b's dimensions the CPU's rows were likely most
    # of the 110 s the 8-layer P0's reference took, one path at a time).
    def _score_many(self, paths: list[tuple[list[int], list[int], int]]) -> list[Completion]:
        try:
            seqs = [prompt + continuation[:-1] if continuation else prompt for prompt, continuation, _ in paths]
            return [scored(lp, prompt, continuation, top_k)
                    for lp, (prompt, continuation, top_k) in zip(self.logprobs_many(seqs), paths)]
        finally:
            self.on_device.w.release()

    @torch.no_grad()
    def logprobs_many(self, seqs: list[list[int]]) -> list[torch.Tensor]:
        """`logprobs` of each sequence, run layer-major on the device; at each layer the spot rows of one sequence
        (taken in turn) and, at the end, of the final norm and lm_head, are recomputed on the CPU. A layer's rows are
        recomputed in a worker thread while the device runs the next layer (torch's kernels release the GIL): the
        wall is about each layer's larger of the two, not their sum, and a disagreement still stops the pass at
        the first layer that has one."""
        dev, cpu = self.on_device, self.checker
        tables = [self.rope_tables(torch.arange(len(ids))) for ids in seqs]
        t = time.perf_counter()
        on_dev = [(cos.to(dev.w.device), sin.to(dev.w.device)) for cos, sin in tables]
        xs = [dev.embed(ids) for ids in seqs]
        _spent(t, "device")

        with ThreadPoolExecutor(max_workers=1) as pool:
            checking = None
            for i in range(int(self.cfg["num_hidden_layers"])):
                t = time.perf_counter()
                s = i % len(seqs)
                rows, x_in = spot_rows(len(seqs[s]), i), xs[s].cpu()
                with room_on(dev.w, f"layer {i}"):
                    xs = dev.layer_many(i, xs, on_dev) if len(xs) > 1 else [dev.layer(i, xs[0], *on_dev[0])]
                got = xs[s][rows.to(xs[s].device)].cpu()
                dev.w.done_with(f"model.layers.{i}.")
                _spent(t, "device")
                _collect(dev.w)
                if checking is not None:
                    self._finish(*checking)
                where = f"layer {i}" + (f" (path {s})" if len(seqs) > 1 else "")
                rows_on_cpu = functools.partial(cpu.layer_rows, i, x_in, *tables[s], rows)
                checking = (where, pool.submit(self._cpu_rows, i, rows_on_cpu), got, rows, "hidden")
            if checking is not None:
                self._finish(*checking)
        out = []
        for s, x in enumerate(xs):
            t = time.perf_counter()
            with room_on(dev.w, "the final norm and lm_head"):
                lp = dev.head(x)
            out.append(lp.cpu())
            t = _spent(t, "device")
            _collect(dev.w)
            if s == len(xs) - 1:
                rows = spot_rows(len(seqs[s]), -1)
                want = cpu.head(x[rows.to(x.device)].cpu())
                _spent(t, "CPU checks", "CPU checks waited")
                self._checked("the final norm and lm_head", out[-1][rows], want, rows, "token")
        return out

    def _finish(self, where: str, pending: Future, got: torch.Tensor, rows: torch.Tensor, column: str) -> None:
        """Wait for a layer's CPU rows (the wait is `CPU checks waited`) and hold the device's rows to them."""
        t = time.perf_counter()
        want = pending.result()
        _spent(t, "CPU checks waited")
        self._checked(where, got, want, rows, column)

    # The per-layer checks feed one block at a time the engine's own input: at gpt-oss-120b's dimensions the CPU took
    # about 8 minutes for 8 layers' blocks (fixtures/device_runs/20261204T202034-bench-p0-L8-0). Each block runs on
    # the device and its spot rows again on the CPU; the device then holds nothing (an engine may start next).
    @torch.no_grad()
    def attention(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        on = self.on_device.w.device
        return self._block("attention", i, x, lambda x: self.on_device.attention(i, x.to(on), cos.to(on), sin.to(on)),
                           lambda x, rows: self.checker._attention_rows(i, x, cos, sin, rows))

    @torch.no_grad()
    def moe(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self._block("moe", i, x, lambda x: self.on_device.moe(i, x.to(self.on_device.w.device)),
                           lambda x, rows: self.checker.moe(i, x[rows]))

    @torch.no_grad()
    def moe_routed(self, i: int, x: torch.Tensor, top_idx: torch.Tensor) -> torch.Tensor:
        on = self.on_device.w.device
        return self._block("moe (given routing)", i, x,
                           lambda x: self.on_device.moe_routed(i, x.to(on), top_idx.to(on)),
                           lambda x, rows: self.checker.moe_routed(i, x[rows], top_idx[rows]))

    @contextmanager
    def checked_beside(self) -> Iterator[None]:
        """Within it, each block's CPU spot rows run in a worker thread while the caller goes on with the device's
        result (the per-layer check's blocks: mathcheck.layers_close judges the engine only after leaving); on
        leaving, every check has run and the first disagreement, in the order the blocks ran, is raised."""
        pool, pending = ThreadPoolExecutor(max_workers=1), []
        self._beside = (pool, pending)
        try:
            yield
        finally:
            self._beside = None
            pool.shutdown(wait=True)
        for args in pending:
            self._finish(*args)

    _beside: tuple[ThreadPoolExecutor, list] | None = None
    BESIDE_QUEUE = 16  # blocks whose CPU rows may wait their turn at once (each holds its input, ~25 MB at 120b)

    def _block(self, what: str, i: int, x: torch.Tensor, on_device: Callable[[torch.Tensor], torch.Tensor],
               on_cpu: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Block `what` of layer i on the device, its spot rows again on the CPU (beside, in `checked_beside`);
        neither keeps the layer."""
        x = x.to(torch.float64)
        t = time.perf_counter()
        try:
            with room_on(self.on_device.w, f"layer {i} {what}"):
                got = on_device(x).cpu()
        finally:
            self.on_device.w.release()
        t = _spent(t, "device")
        _collect(self.on_device.w)
        rows = spot_rows(x.shape[0], i)
        rows_on_cpu = functools.partial(on_cpu, x, rows)
        if self._beside is None:
            want = self._cpu_rows(i, rows_on_cpu, "CPU checks waited")
            self._checked(f"layer {i} {what}", got[rows], want, rows, "hidden")
            return got
        pool, pending = self._beside
        waiting = [p[1] for p in pending if not p[1].done()]
        if len(waiting) >= self.BESIDE_QUEUE:
            wait(waiting[:1])  # its result, or its error, is read on leaving, in order
            _spent(t, "CPU checks waited")
        pending.append((f"layer {i} {what}", pool.submit(self._cpu_rows, i, rows_on_cpu), got[rows], rows, "hidden"))
        return got

    def _cpu_rows(self, i: int, compute: Callable[[], torch.Tensor], *also: str) -> torch.Tensor:
        """`compute()`, the CPU's spot rows of a layer-i result (in the caller's thread or a worker's), timed as
        `CPU checks` and `also`; the CPU's copy of layer i dropped after it."""
        t = time.perf_counter()
        try:
            with torch.no_grad():  # grad mode is per thread
                return compute()
        finally:
            self.checker.w.done_with(f"model.layers.{i}.")
            _spent(t, "CPU checks", *also)

    @torch.no_grad()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        return self.logprobs_many([ids])[0]


def reference_for(model_dir: Path | str, streaming: bool, device: str | None) -> Reference:
    """The run's fp64 reference: on `device` (the target's `reference_device`), else the CPU's."""
    if device is None:
        return Reference(model_dir, streaming=streaming)
    return DeviceReference(model_dir, streaming=streaming, device=device)


def noise_twin(reference: Reference, dtype: str) -> Reference:
    """`reference` holding its weights and activations in `dtype` (Math.activations): the same class, checkpoint,
    math and device; what a healthy engine of that dtype would compute, less its kernels' own rounding."""
    import dataclasses

    math_ = dataclasses.replace(reference.math, activations=dtype)
    if isinstance(reference, DeviceReference):
        return DeviceReference(reference.model_dir, math_, reference.w.streaming, str(reference.on_device.w.device))
    return type(reference)(reference.model_dir, math_, streaming=reference.w.streaming)


def _agreement(model_dir: Path, device: str, layers: int | None, tokens: int, seed: int, paths: int = 1) -> int:
    """Device against CPU fp64 on one sampled sequence, per layer, with wall times; then the spot-checked device
    reference on `paths` sampled sequences at once (layer by layer, as greedy parity scores its prompt set), with
    where its time went."""
    cpu, dev = Reference(model_dir, streaming=True), Reference(model_dir, streaming=True, device=device)
    if layers is not None:  # the first N layers of a deeper checkpoint: the agreement per layer does not need all
        for ref in (cpu, dev):
            ref.cfg["num_hidden_layers"] = min(layers, int(ref.cfg["num_hidden_layers"]))
    ids = random.Random(seed).choices(range(cpu.vocab_size - 8), k=tokens)
    cos, sin = cpu.rope_tables(torch.arange(tokens))
    wall = {"cpu": 0.0, "device": 0.0}

    def timed(side: str, fn: Callable[..., torch.Tensor], *args: object) -> torch.Tensor:
        started = time.perf_counter()
        out = fn(*args)
        if side == "device" and torch.cuda.is_available():
            torch.cuda.synchronize()
        wall[side] += time.perf_counter() - started
        return out

    with torch.no_grad():
        x_cpu, x_dev = timed("cpu", cpu.embed, ids), timed("device", dev.embed, ids)
        cos_d, sin_d = cos.to(dev.w.device), sin.to(dev.w.device)
        print(f"{model_dir}: {tokens} tokens, {cpu.cfg['num_hidden_layers']} layers, device {device}")
        print("layer  max |Δ hidden|  max |Δ| / max |hidden|  max |Δ logprob| (head on this layer's output)")
        for i in range(int(cpu.cfg["num_hidden_layers"])):
            x_cpu = timed("cpu", cpu.layer, i, x_cpu, cos, sin)
            x_dev = timed("device", dev.layer, i, x_dev, cos_d, sin_d)
            cpu.w.done_with(f"model.layers.{i}.")
            dev.w.done_with(f"model.layers.{i}.")
            diff = float((x_dev.cpu() - x_cpu).abs().max())
            d_lp = float((dev.head(x_dev).cpu() - cpu.head(x_cpu)).abs().max())
            print(f"{i:5d}  {diff:14.3g}  {diff / float(x_cpu.abs().max()):22.3g}  {d_lp:.3g}")
        lp_cpu, lp_dev = timed("cpu", cpu.head, x_cpu), timed("device", dev.head, x_dev)
    print(f"logprobs: max |Δ| {float((lp_dev.cpu() - lp_cpu).abs().max()):.3g}")
    print(f"wall: device ({device}) {wall['device']:.2f} s, cpu {wall['cpu']:.2f} s "
          "(the heads of the per-layer lines not counted)")
    started, before = time.perf_counter(), dict(SPENT)
    checked = DeviceReference(model_dir, streaming=True, device=device)
    checked.cfg["num_hidden_layers"] = int(cpu.cfg["num_hidden_layers"])
    more = random.Random(seed + 1)
    checked.logprobs_many([ids, *(more.choices(range(cpu.vocab_size - 8), k=tokens) for _ in range(paths - 1))])
    print(f"spot-checked device reference, {paths} path{'s' * (paths > 1)}: {time.perf_counter() - started:.2f} s, "
          f"worst relative disagreement {checked.worst_rel:.3g} (allowed {SPOT_RTOL:g})")
    # where its time went, as a run's phases "reference: ..." record it, and a widening's own time (3.95 ms on the
    # H200 when it was one slow gather kernel; 0.29-0.41 ms since)
    spent = {what: seconds - before[what] for what, seconds in SPENT.items()}
    widened = checked.on_device.w.widened
    print("  " + ", ".join(f"{what} {seconds:.2f} s" for what, seconds in spent.items())
          + (f"; {widened} MXFP4 matrices widened, {spent['device dequantize'] / widened * 1e3:.2f} ms each"
             if widened else "; no MXFP4 matrix"))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.reference.device", description=_agreement.__doc__)
    p.add_argument("--model", required=True, help="gpt-oss checkpoint directory (HF layout)")
    p.add_argument("--device", default="cuda", help="torch device of the fp64 reference (default cuda; HIP is cuda)")
    p.add_argument("--layers", type=int, default=None, help="only the first N layers (default all)")
    p.add_argument("--tokens", type=int, default=294, help="length of the sampled sequence (default 294)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--paths", type=int, default=1,
                   help="sequences the spot-checked pass scores at once, layer by layer (default 1; greedy parity "
                        "scores the prompt set's 8)")
    ns = p.parse_args(argv)
    if ns.paths < 1:
        p.exit(2, f"--paths {ns.paths}: the spot-checked pass scores at least one sequence.\n")
    model = Path(ns.model)
    if not (model / "config.json").is_file():
        print(f"{model} holds no config.json: pass a gpt-oss checkpoint directory.", file=sys.stderr)
        return 2
    return _agreement(model, ns.device, ns.layers, ns.tokens, ns.seed, ns.paths)


if __name__ == "__main__":
    sys.exit(main())
