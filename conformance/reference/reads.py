"""How long the device reference's weight store takes to bring one layer's experts onto its device, per way of
reading them.

An H200 spent 40.3 s of its device reference's 65.5 s at 24 layers of gpt-oss-120b's dimensions reading weights
(1.7 s a layer). The store reads each routed expert's slices one by one (`WeightStore._slice`); an H100 read them at
7.6 GB/s as pageable copies and at 26.7 GB/s through pinned host buffers, and the store now reads a GPU's through
pinned buffers (docs/notebook/2026-12-measurements.md, the sessions of 2026-12-06). This says what each way costs on
a node:

`python -m conformance.reference.reads --model DIR [--layer N] [--device cuda] [--repeats 5]` prints, for one
layer's expert tensors, median / min / max seconds and GB/s of:
- the store's own way (`_slice` for every expert and tensor: on a GPU through its pinned buffers);
- each expert's slices copied on the host alone (what a copy through host buffers pays before the device);
- the layer's whole tensors at once;
- on a GPU, each expert's slices copied to the device from pageable memory (the store's earlier way).

On the CPU the store takes views of the mapped file (nothing is copied until the math reads it), so there only the
host copy says something. Torch and safetensors only: no engine, no server.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from conformance.reference.gpt_oss import WeightStore

EXPERT_TENSORS = ("gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales",
                  "gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias")


def expert_tensors(store: WeightStore, layer: int) -> list[str]:
    """The checkpoint's expert tensors of `layer` ([experts, ...] each), MXFP4 or plain."""
    prefix = f"model.layers.{layer}.mlp.experts."
    return [prefix + stem for stem in EXPERT_TENSORS if prefix + stem in store]


def ways(store: WeightStore, names: list[str]) -> dict[str, Callable[[], None]]:
    """Each way of reading the tensors `names` onto the store's device, by name."""
    experts = int(store.where[names[0]].get_slice(names[0]).get_shape()[0])
    device = store.device

    def the_store_s() -> None:
        for e in range(experts):
            for name in names:
                store._slice(name, e)
        store.settle()  # the store's own timing events of these reads, read in and dropped

    def copied() -> None:
        for e in range(experts):
            for name in names:
                store.where[name].get_slice(name)[e].clone()

    def whole() -> None:
        for name in names:
            store.where[name].get_tensor(name).to(device)

    found: dict[str, Callable[[], None]] = {"the store's (each expert's slices)": the_store_s,
                                            "each expert's slices copied on the host": copied,
                                            "the layer's whole tensors": whole}
    if device.type == "cuda":
        def pageable() -> None:
            for e in range(experts):
                for name in names:
                    store.where[name].get_slice(name)[e].to(device)

        found["each expert's slices from pageable memory"] = pageable
    return found


def timed(fn: Callable[[], None], device: torch.device, repeats: int) -> list[float]:
    """Seconds of `repeats` calls of fn, each to the end of its work on the device."""
    seconds = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - started)
    return seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.reference.reads", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="gpt-oss checkpoint directory (HF layout)")
    p.add_argument("--layer", type=int, default=0, help="the layer whose experts are read (default 0)")
    p.add_argument("--device", default="cuda", help="torch device of the store (default cuda; HIP is cuda)")
    p.add_argument("--repeats", type=int, default=5, help="reads per way (default 5)")
    ns = p.parse_args(argv)
    if ns.repeats < 1:
        p.exit(2, f"--repeats {ns.repeats}: each way is read at least once.\n")
    store = WeightStore(Path(ns.model), device=ns.device)
    names = expert_tensors(store, ns.layer)
    if not names:
        print(f"{ns.model} holds no expert tensors of layer {ns.layer}: pass a gpt-oss checkpoint directory and one "
              "of its layers.", file=sys.stderr)
        return 2
    size = sum(_stored_bytes(store, n) for n in names)
    print(f"layer {ns.layer}: {len(names)} expert tensors, {size / 1e9:.3f} GB as stored, onto {store.device}, "
          f"{ns.repeats} reads each")
    for name, fn in ways(store, names).items():
        seconds = timed(fn, store.device, ns.repeats)
        median = statistics.median(seconds)
        print(f"  {name:46s} median {median:8.4f} s  min {min(seconds):8.4f} s  max {max(seconds):8.4f} s  "
              f"{size / max(median, 1e-9) / 1e9:7.2f} GB/s")
    return 0


def _stored_bytes(store: WeightStore, name: str) -> int:
    tensor = store.where[name].get_tensor(name)  # a view of the mapped file: nothing is read
    return tensor.numel() * tensor.element_size()


if __name__ == "__main__":
    sys.exit(main())
