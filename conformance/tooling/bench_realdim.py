"""`nox -s bench -- --realdim 2,8,24 --tiers p0 --runs 1 --cuda`: a tier at gpt-oss-120b's real dimensions with a few
layers, per layer count, and the fit of its wall time against the layer count, extrapolated to the real model.

For each layer count the checkpoint is written once by `conformance.checkpoints.quant.realdim` (random weights in
the real on-disk layout; about 1.75 GB a layer plus 2.3 GB of embeddings, so 36 layers take 65 GB), as
`<dir>/realdim-<variant>-<L>-layers` (reused when already complete there), its writing timed as `generate`, and
every run gets `--model` it. A checkpoint the bench wrote is removed after its runs unless --keep-checkpoints: a
64 GB disk holds the 24-layer one, not it and the others. The fit is least squares over every run,
`wall = a + b x layers`: `a` is what does not grow with depth (engine and server start-ups, imports, the fixed
checks), `b` the seconds each layer adds (weights to read and hash, the fp64 reference's layers, the decode); the
same fit per phase says which phases will dominate at full depth. Issue 38's bar is P0 on the full model within
GOAL_S, weights load included.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GOAL_S = 600.0  # real-size P0 on one GPU in 10 minutes, weights load included
SECOND_NODE_GOAL_S = 300.0  # a second node of the fleet, the same weights, in 5 minutes
GPT_OSS = Path(__file__).resolve().parents[1] / "data" / "gpt_oss.toml"  # the published models' dimensions
DISK_MARGIN = 1.05  # the writer's shards plus the tokenizer files and some room
_NAME = re.compile(r"realdim-(?P<variant>[\w.-]+?)-(?P<layers>\d+)-layers")


class RealdimError(RuntimeError):
    """A layer count, checkpoint or fit the bench cannot use; one sentence."""


@dataclass(frozen=True)
class Checkpoint:
    """One layer count's checkpoint: where it goes, its disk use, and whether a complete one is already there."""
    layers: int
    path: Path
    bytes: int
    present: bool


def heading(name: str) -> str:
    """'p0 bfloat16 at 2 layers' -> 'P0 bfloat16 at 2 layers': the tier in capitals, the rest as it is."""
    tier, _, rest = name.partition(" ")
    return f"{tier.upper()} {rest}".rstrip()


def parse_layers(text: str) -> list[int]:
    """'2,8,24' -> [2, 8, 24] (sorted, each once); anything else is refused in one sentence."""
    try:
        layers = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        layers = []
    if not layers or layers[0] < 1:
        raise RealdimError(f"--realdim wants layer counts like 2,8,24, not {text!r}.")
    return layers


def real_layers(variant: str) -> int:
    """The published model's depth (36 for gpt-oss-120b): what the fit extrapolates to."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    return int(tomllib.loads(GPT_OSS.read_text())["variants"][variant]["num_hidden_layers"])


def checkpoint_dir(root: Path, variant: str, layers: int) -> Path:
    return root / f"realdim-{variant}-{layers}-layers"


def is_complete(path: Path, layers: int) -> bool:
    """A checkpoint the writer finished: its config at this depth, every shard of its index, the tokenizer."""
    try:
        cfg = json.loads((path / "config.json").read_text())
        index = json.loads((path / "model.safetensors.index.json").read_text())
    except (OSError, ValueError):
        return False
    shards = set(index.get("weight_map", {}).values())
    return (cfg.get("num_hidden_layers") == layers and bool(shards) and (path / "tokenizer.json").is_file()
            and all((path / s).is_file() for s in shards))


def sizes(layer_counts: list[int], variant: str, python: str) -> dict[str, Any]:
    """The writer's own answer (`realdim --sizes`, in the stack's Python: this module imports nothing of the suite)
    to how much disk each layer count takes, and the cache's place for the checkpoints."""
    cmd = [python, "-m", "conformance.checkpoints.quant.realdim", "--variant", variant,
           "--sizes", ",".join(map(str, layer_counts))]
    done = subprocess.run(cmd, capture_output=True, text=True)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise RealdimError(f"{' '.join(cmd)} exited {done.returncode} without its sizes: "
                           f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}") from None


def plan(layer_counts: list[int], root: Path | None, variant: str, python: str) -> list[Checkpoint]:
    """The checkpoint of each layer count, under `root` (default: the suite's cache, realdim/)."""
    known = sizes(layer_counts, variant, python)
    root = root if root is not None else Path(known["root"])
    out = []
    for layers in layer_counts:
        path = checkpoint_dir(root, variant, layers)
        out.append(Checkpoint(layers, path, int(known["bytes"][str(layers)]), is_complete(path, layers)))
    return out


def check_disk(ckpt: Checkpoint, free_bytes: int) -> None:
    """Refuse, before writing a byte, a checkpoint the disk cannot hold."""
    need = int(ckpt.bytes * DISK_MARGIN)
    if not ckpt.present and need > free_bytes:
        raise RealdimError(f"the {ckpt.layers}-layer checkpoint needs {need / 1e9:.1f} GB and {ckpt.path.parent} "
                           f"has {free_bytes / 1e9:.1f} GB free: bench fewer layers or free the disk.")


def free_bytes(root: Path) -> int:
    root.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(root).free


def generate(ckpt: Checkpoint, variant: str, python: str) -> float:
    """Write the checkpoint (in a child process: it holds a layer's tensors at a time); its seconds."""
    cmd = [python, "-m", "conformance.checkpoints.quant.realdim", str(ckpt.path), "--layers", str(ckpt.layers),
           "--variant", variant]
    print(f"bench: writing the {ckpt.layers}-layer real-dimension checkpoint ({ckpt.bytes / 1e9:.1f} GB): "
          + " ".join(cmd), flush=True)
    started = time.perf_counter()
    code = subprocess.run(cmd).returncode
    seconds = time.perf_counter() - started
    if code != 0 or not is_complete(ckpt.path, ckpt.layers):
        raise RealdimError(f"writing the {ckpt.layers}-layer checkpoint to {ckpt.path} failed (exit {code}; "
                           "see its output).")
    return seconds


def remove(ckpt: Checkpoint) -> None:
    shutil.rmtree(ckpt.path, ignore_errors=True)


def layers_of(record: dict[str, Any]) -> int | None:
    """The layer count of a recorded run's real-dimension checkpoint (from its name, else its config.json where
    the path still exists); None for another model."""
    model = record.get("model") or {}
    for text in (model.get("path"), model.get("name")):
        match = _NAME.search(str(text or ""))
        if match:
            return int(match["layers"])
    path = model.get("path")
    if path and "realdim" in str(path):
        try:
            return int(json.loads((Path(path) / "config.json").read_text())["num_hidden_layers"])
        except (OSError, ValueError, KeyError):
            return None
    return None


@dataclass(frozen=True)
class Fit:
    """`seconds = a + b x layers`, least squares over `n` runs; r2 where there are more points than unknowns."""
    a: float
    b: float
    n: int
    r2: float | None

    def at(self, layers: int) -> float:
        return self.a + self.b * layers


def fit(points: list[tuple[int, float]]) -> Fit:
    """Least squares of seconds on layers; at least two layer counts, or the slope is unknown."""
    if len({x for x, _ in points}) < 2:
        raise RealdimError("a fit of wall against layers needs runs at two layer counts at least "
                           f"(got {sorted({x for x, _ in points}) or 'none'}): bench e.g. --realdim 2,8.")
    xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    r2 = None
    if len(points) > 2:
        syy = sum((y - my) ** 2 for y in ys)
        rss = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
        r2 = 1.0 - rss / syy if syy > 0 else 1.0
    return Fit(a, b, len(points), r2)


def machines_line(records: list[dict[str, Any]]) -> str | None:
    """Where a fit's runs come from more than one machine (told apart by their GPUs' UUIDs), one line that says so
    and how far their hosts' single-thread speeds differ: a fit across machines is not like for like (one H200 node
    imported its stack in 24 s, another in 16-17 s). None for one machine."""
    platforms = [((r.get("fingerprint") or {}).get("platform") or {}) for r in records]
    machines = {tuple(p.get("gpu_uuids") or ()) for p in platforms}
    if len(machines) < 2:
        return None
    mops = sorted(p["host_single_thread_mops"] for p in platforms if p.get("host_single_thread_mops"))
    copies = sorted(p["host_copy_gbs"] for p in platforms if p.get("host_copy_gbs"))
    speeds = (f", host single-thread {mops[0]:g}-{mops[-1]:g} M ops/s" if mops else "") + \
        (f", host memory copy {copies[0]:g}-{copies[-1]:g} GB/s" if copies else "")
    return (f"(these {len(records)} runs come from {len(machines)} machines{speeds}: not like for like; only runs "
            "of one machine make a fit of one machine)")


def format_fit(tier: str, by_layers: dict[int, list[dict[str, float]]], target_layers: int = 36,
               goal_s: float = GOAL_S, top: int = 12) -> str:
    """The wall fit and its extrapolation against the goal, then the same fit per phase (those in every run),
    largest at `target_layers` first."""
    points = lambda name: [(L, s[name]) for L, samples in by_layers.items() for s in samples if name in s]  # noqa: E731
    wall = fit(points("wall"))
    at = wall.at(target_layers)
    verdict = "within" if at <= goal_s else "over"
    r2 = f", r2 {wall.r2:.3f}" if wall.r2 is not None else ""
    line = f"{heading(tier)} wall against layers ({wall.n} runs at {sorted(by_layers)} layers{r2}): "
    if wall.b <= 0:  # the shallower runs' fixed costs (cold caches, a slower host) outweigh what depth adds
        line += (f"{wall.a:.1f} s + {wall.b:.2f} s x layers: the wall does not grow with depth across these runs, so "
                 f"it says nothing of {target_layers} layers; their fixed costs differ (the phases below grow)")
    else:
        line += (f"{wall.a:.1f} s + {wall.b:.2f} s x layers; at {target_layers} layers {at:.0f} s = {at / 60:.1f} "
                 f"min, {verdict} the {goal_s / 60:.0f}-minute goal ({at / goal_s:.2f} x)")
    lines = [line]
    every = set.intersection(*(set(s) for samples in by_layers.values() for s in samples))
    skip = {"wall", "outer_wall", "load_1m", "host_mops", "floor", "floor_ratio", "generate"}
    fits = [(name, fit(points(name))) for name in every - skip if not name.startswith("reference results ")]
    fits.sort(key=lambda nf: -nf[1].at(target_layers))
    width = max([len(n) for n, _ in fits[:top]] + [len("phase")])
    lines.append(f"{'phase':{width}s} {'a (s)':>9s} {'s/layer':>9s} {f'at {target_layers}':>9s}")
    for name, f in fits[:top]:
        lines.append(f"{name:{width}s} {f.a:9.1f} {f.b:9.2f} {f.at(target_layers):9.1f}")
    if len(fits) > top:
        lines.append(f"({len(fits) - top} smaller phases left out)")
    return "\n".join(lines)
