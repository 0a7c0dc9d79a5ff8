"""P3 accuracy: EleutherAI's lm-eval run against the OpenAI-compatible server under test on local copies
of gsm8k, GPQA Diamond and AIME (nothing is downloaded), its results file parsed into a score, the pass
mark derived from the published figure by one explicit rule, and the proof that the reasoning effort
asked for was rendered into the prompt. Tasks, figures and the rule are data (data/accuracy.toml)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from conformance import datafiles
from conformance.engines.vllm_server import ServerClient, _tail
from conformance.verdicts.compare import VerdictReport
from conformance.verdicts.perf import PerfError, child_env, run_in_group
from conformance.verdicts.verdict import FigureLimit, Verdict

ACCURACY_DATA = datafiles.DATA / "accuracy.toml"
# The directory with the eval datasets (the `--eval-data DIR` option is meant to set it).
EVAL_DATA_ENV = "CONFORMANCE_EVAL_DATA"
FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
TASK_PREFIX = "conformance_"


class AccuracyError(RuntimeError):
    """lm-eval could not run, or left no usable result; the message says which and where its log is."""


@cache
def accuracy_data() -> dict[str, Any]:
    return datafiles.load_toml(ACCURACY_DATA)


@dataclass(frozen=True)
class EvalTask:
    name: str
    base: str
    metric: str
    efforts: tuple[str, ...]
    files: dict[str, tuple[str, ...]]
    gen_kwargs: dict[str, Any] = field(default_factory=dict)
    num_fewshot: int | None = None
    limit: int | None = None


def tasks(data: dict[str, Any] | None = None) -> dict[str, EvalTask]:
    out = {}
    for name, row in (data or accuracy_data())["tasks"].items():
        out[name] = EvalTask(name, row["base"], row["metric"], tuple(row["efforts"]),
                             {split: tuple(paths) for split, paths in row["files"].items()},
                             dict(row.get("gen_kwargs", {})), row.get("num_fewshot"), row.get("limit"))
    return out


def cases(data: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(task, effort) pairs, one check each."""
    return [(t.name, effort) for t in tasks(data).values() for effort in t.efforts]


@dataclass(frozen=True)
class PassRule:
    """How a published figure becomes a pass mark (accuracy.toml [rule])."""

    kind: str
    margin: float
    ratio: float

    def pass_mark(self, reference: float) -> float:
        return reference - self.margin if self.kind == "margin" else reference * self.ratio

    def describe(self) -> str:
        if self.kind == "margin":
            return f"reference - {self.margin:g} (vLLM CI rule)"
        return f"{self.ratio:.0%} of reference (MLPerf rule)"


def pass_rule(data: dict[str, Any] | None = None) -> PassRule:
    row = (data or accuracy_data())["rule"]
    if row["kind"] not in ("margin", "ratio"):
        raise datafiles.DataError(f"accuracy.toml [rule] kind is {row['kind']!r}: use 'margin' or 'ratio'.")
    return PassRule(row["kind"], float(row.get("margin", 0.0)), float(row.get("ratio", 1.0)))


@dataclass(frozen=True)
class Reference:
    model: str
    task: str
    effort: str
    value: float
    source: str


def identify_model(config: dict[str, Any] | None, served_name: str | None,
                   data: dict[str, Any] | None = None) -> str | None:
    """Which published model this is: by its config.json, else by the served model's name."""
    models = (data or accuracy_data())["models"]
    if config:
        for name, row in models.items():
            if all(config.get(k) == v for k, v in row["config"].items()):
                return name
        return None
    for name, row in models.items():
        if served_name and any(n in served_name for n in row.get("names", [])):
            return name
    return None


def reference_figure(model: str, task: str, effort: str, data: dict[str, Any] | None = None) -> Reference | None:
    row = (data or accuracy_data()).get("reference", {}).get(model, {}).get(task, {})
    if effort not in row:
        return None
    return Reference(model, task, effort, float(row[effort]), str(row.get("source", "")))


def eval_data_dir() -> Path | None:
    value = os.environ.get(EVAL_DATA_ENV)
    return Path(value) if value else None


def resolve_files(task: EvalTask, data_dir: Path) -> tuple[dict[str, Path], list[str]]:
    """Each split's first existing candidate file, and a sentence per split that has none."""
    found, missing = {}, []
    for split, candidates in task.files.items():
        hit = next((data_dir / c for c in candidates if (data_dir / c).is_file()), None)
        if hit is None:
            missing.append(f"{task.name} {split} split (one of {', '.join(candidates)})")
        else:
            found[split] = hit.resolve()
    return found, missing


def lm_eval_tasks_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise AccuracyError("lm-eval is not installed here: pip install '.[eval]' (the eval extra pins it).")
    return Path(next(iter(spec.submodule_search_locations))) / "tasks"


def write_task_config(task: EvalTask, files: dict[str, Path], include_dir: Path) -> str:
    """lm-eval's own task config with its dataset replaced by the local files; returns the task name.
    Written as JSON, which YAML reads as it is."""
    base = lm_eval_tasks_dir() / task.base
    if not base.is_file():
        raise AccuracyError(f"lm-eval has no task config {task.base} (accuracy.toml [tasks.{task.name}] base)")
    formats = {FORMATS.get(p.suffix) for p in files.values()}
    if len(formats) != 1 or None in formats:
        raise AccuracyError(f"{task.name}: the files {[str(p) for p in files.values()]} are not all of one format "
                            f"({', '.join(FORMATS)})")
    name = TASK_PREFIX + task.name
    config: dict[str, Any] = {"include": str(base), "task": name, "dataset_path": formats.pop(),
                              "dataset_name": None, "dataset_kwargs": {"data_files": {k: str(v)
                                                                                      for k, v in files.items()}}}
    if task.num_fewshot is not None:
        config["num_fewshot"] = task.num_fewshot
    include_dir.mkdir(parents=True, exist_ok=True)
    (include_dir / f"{name}.yaml").write_text(json.dumps(config, indent=1) + "\n")
    return name


@dataclass(frozen=True)
class LmEvalSettings:
    model_type: str
    endpoint: str
    num_concurrent: int
    max_retries: int
    request_timeout_s: int
    run_timeout_s: float


def lm_eval_settings(data: dict[str, Any] | None = None) -> LmEvalSettings:
    row = (data or accuracy_data())["lm_eval"]
    return LmEvalSettings(row["model_type"], row["endpoint"], int(row["num_concurrent"]), int(row["max_retries"]),
                          int(row["request_timeout_s"]), float(row["run_timeout_s"]))


def lm_eval_command(cfg: LmEvalSettings, base_url: str, model: str, task_name: str, task: EvalTask, effort: str,
                    include_dir: Path, out_dir: Path) -> list[str]:
    model_args = (f"base_url={base_url.rstrip('/')}{cfg.endpoint},model={model},num_concurrent={cfg.num_concurrent},"
                  f"max_retries={cfg.max_retries},timeout={cfg.request_timeout_s},tokenized_requests=False")
    gen = [f"{k}={v}" for k, v in task.gen_kwargs.items()] + [f"reasoning_effort={effort}"]
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", cfg.model_type, "--model_args", model_args,
           "--tasks", task_name, "--include_path", str(include_dir), "--gen_kwargs", *gen,
           "--output_path", str(out_dir), "--log_samples"]
    if cfg.model_type.endswith("chat-completions"):
        cmd.append("--apply_chat_template")
    if task.limit is not None:
        cmd += ["--limit", str(task.limit)]
    return cmd


@dataclass(frozen=True)
class EvalScore:
    task: str
    metric: str
    score: float
    stderr: float | None
    samples: int
    answered: int  # documents whose response is not empty
    results_file: Path
    efforts_sent: frozenset[str] = frozenset()  # reasoning_effort in the generation args of the samples


def _samples_summary(path: Path) -> tuple[int, int, frozenset[str]]:
    """Documents, documents answered (non-empty response) and the reasoning efforts lm-eval sent, read
    from its samples file (one line per document and filter)."""
    docs: set[Any] = set()
    answered: set[Any] = set()
    efforts: set[str] = set()
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        sample = json.loads(line)
        docs.add(sample.get("doc_id"))
        if any(str(r).strip() for r in _flatten(sample.get("resps"))):
            answered.add(sample.get("doc_id"))
        for args in (sample.get("arguments") or {}).values():
            gen = args.get("arg_1") if isinstance(args, dict) else None
            if isinstance(gen, dict) and "reasoning_effort" in gen:
                efforts.add(str(gen["reasoning_effort"]))
    return len(docs), len(answered), frozenset(efforts)


def parse_lm_eval_results(out_dir: Path, task_name: str, metric: str) -> EvalScore:
    """The score of `task_name` from the newest results_*.json lm-eval wrote under `out_dir`, with what
    its samples file says (documents answered, reasoning efforts sent)."""
    found = sorted(out_dir.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise AccuracyError(f"lm-eval wrote no results_*.json under {out_dir}")
    path = found[-1]
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        raise AccuracyError(f"lm-eval's {path} is not JSON ({exc})") from None
    row = (doc.get("results") or {}).get(task_name)
    if row is None:
        raise AccuracyError(f"{path} has no results for {task_name} (tasks: {sorted(doc.get('results') or {})})")
    value = row.get(metric)
    if not isinstance(value, (int, float)):
        raise AccuracyError(f"{path} has no {metric!r} for {task_name} (keys: {sorted(row)}): the task's metric or "
                            "filter changed; fix accuracy.toml")
    name, _, filt = metric.partition(",")
    stderr = row.get(f"{name}_stderr,{filt}" if filt else f"{name}_stderr")
    n = (doc.get("n-samples") or {}).get(task_name, {}).get("effective")
    samples = sorted(path.parent.glob(f"samples_{task_name}_*.jsonl"), key=lambda p: p.stat().st_mtime)
    docs, answered, efforts = _samples_summary(samples[-1]) if samples else (0, 0, frozenset())
    return EvalScore(task_name, metric, float(value), float(stderr) if isinstance(stderr, (int, float)) else None,
                     int(n) if isinstance(n, int) else docs, answered, path, efforts)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [x for v in value for x in _flatten(v)]
    return [] if value is None else [value]


def run_lm_eval(cfg: LmEvalSettings, base_url: str, model: str, api_key: str | None, task: EvalTask, effort: str,
                files: dict[str, Path], work_dir: Path, fork_ctx: Any = None) -> EvalScore:
    """One lm-eval run of one task at one effort, offline, in its own process group (forked from `fork_ctx`, a
    forkserver context, when given)."""
    include_dir, out_dir = work_dir / "tasks", work_dir / "out"
    task_name = write_task_config(task, files, include_dir)
    cmd = lm_eval_command(cfg, base_url, model, task_name, task, effort, include_dir, out_dir)
    env = child_env({"OPENAI_API_KEY": api_key or "EMPTY", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                     "HF_DATASETS_CACHE": str(work_dir / "hf-datasets"), "TOKENIZERS_PARALLELISM": "false"})
    log_path = work_dir / "lm-eval.log"
    try:
        code = run_in_group("lm-eval", cmd, env, log_path, cfg.run_timeout_s, fork_ctx)
    except PerfError as exc:
        raise AccuracyError(str(exc)) from None
    if code != 0:
        raise AccuracyError(f"lm-eval exited with code {code}; its log {log_path}, last lines:\n{_tail(log_path, 25)}")
    return parse_lm_eval_results(out_dir, task_name, task.metric)


@dataclass
class AccuracyVerdict(Verdict):
    score: EvalScore
    reference: Reference
    rule: PassRule
    problems: list[str] = field(default_factory=list)

    @property
    def pass_mark(self) -> float:
        return self.rule.pass_mark(self.reference.value)

    def figures(self) -> dict[str, float]:
        out = {"score": self.score.score, "reference": self.reference.value, "pass_mark": self.pass_mark,
               "samples": float(self.score.samples), "answered": float(self.score.answered)}
        if self.score.stderr is not None:
            out["score_stderr"] = self.score.stderr
        return out

    def limits(self) -> dict[str, FigureLimit]:
        return {"score": FigureLimit(self.pass_mark, "min", f"the pass mark of {self.reference.value:g} "
                                     "(data/accuracy.toml)")}

    def failure_message(self) -> str:
        r = self.reference
        return (f"{r.model} {r.task} at reasoning effort {r.effort}: " + "; ".join(self.problems)
                + f"\n  results: {self.score.results_file}\n  reference: {r.value:.3f} ({r.source})")


def accuracy_verdict(score: EvalScore, reference: Reference, rule: PassRule) -> AccuracyVerdict:
    verdict = AccuracyVerdict(score, reference, rule)
    if score.samples == 0:
        verdict.problems.append("lm-eval scored no samples")
    elif score.answered == 0:
        verdict.problems.append(f"none of the {score.samples} samples got a non-empty answer from the server")
    if score.efforts_sent != {reference.effort}:
        verdict.problems.append(f"lm-eval sent reasoning_effort {sorted(score.efforts_sent) or 'none'}, not "
                                f"{reference.effort!r}: the score is not for this effort")
    mark = verdict.pass_mark
    if not score.score >= mark:  # NaN fails too
        verdict.problems.append(f"{score.metric} = {score.score:.4f} is below the pass mark {mark:.4f} = "
                                f"{rule.describe()} with reference {reference.value:.3f}")
    return verdict


def effort_rendered(client: ServerClient, model: str, effort: str, timeout_s: float) -> VerdictReport:
    """Send the chat shape lm-eval sends, with this reasoning effort; the prompt the server fed the model
    (its prompt_token_ids, detokenized by the server) must carry harmony's `Reasoning: <effort>` line."""
    probe = VerdictReport(f"reasoning_effort={effort}")
    body = {"model": model, "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 1,
            "temperature": 0, "reasoning_effort": effort, "return_token_ids": True}
    res = client.post("/v1/chat/completions", body, timeout_s=timeout_s)
    if res.status != 200:
        probe.problems.append(f"the chat request answered HTTP {res.status}: {res.body[:300]!r}")
        return probe
    ids = res.json().get("prompt_token_ids")
    if not ids:
        probe.problems.append("the server returns no prompt_token_ids (return_token_ids): the rendered prompt "
                              "cannot be verified")
        return probe
    text = client.post("/detokenize", {"model": model, "tokens": ids}, timeout_s=timeout_s)
    if text.status != 200:
        probe.problems.append(f"/detokenize answered HTTP {text.status}: {text.body[:200]!r}")
        return probe
    prompt = str(text.json().get("prompt", ""))
    probe.details.append(f"prompt the server rendered: {prompt[:600]!r}")
    want = f"Reasoning: {effort}"
    if want not in prompt:
        probe.problems.append(f"the prompt has no {want!r} line: the effort was ignored or written another way "
                              "(docs/failure-modes.md, mode 10)")
    return probe
