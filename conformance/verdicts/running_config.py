"""Whether an engine runs the configuration it was asked for: the fields it reports (its start info's `running`,
conformance/engines/running_config.py) against the options and environment it was started with (targets.toml, the
serving profile and its backend row), one field at a time as data/engines.toml [engines.<engine>.running.fields]
says. A field nobody asked for is recorded, never judged; a field asked for that the engine could not report fails."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conformance import datafiles
from conformance.reference import kv_model
from conformance.verdicts.verdict import Verdict

NOT_READ = object()  # a path the report does not have


@dataclass(frozen=True)
class FieldRule:
    """One row of [engines.<engine>.running.fields]: the reported field, what it answers (an engine option or a
    variable of the engine's environment) and how the two compare."""

    field: str
    option: str | None = None
    env: str | None = None
    rule: str = "equal"


@dataclass(frozen=True)
class RunningSpec:
    """What an engine reports of the configuration it runs, as data/engines.toml declares it."""

    fields: tuple[FieldRule, ...]
    env_prefixes: tuple[str, ...]


def spec_for(engine: str, table: Mapping[str, Any] | None = None) -> RunningSpec:
    """The running-config declaration of `engine` (data/engines.toml); ValueError, in one sentence, for a row with
    neither an option nor a variable, or a rule this module does not know."""
    table = table if table is not None else datafiles.load_toml(datafiles.DATA / "engines.toml")
    running = table.get("engines", {}).get(engine, {}).get("running", {})
    rules = []
    for name, row in running.get("fields", {}).items():
        rule = FieldRule(name, row.get("option"), row.get("env"), row.get("rule", "equal"))
        if (rule.option is None) == (rule.env is None) or rule.rule not in RULES:
            raise ValueError(f"engines.toml [engines.{engine}.running.fields] {name}: a row names one `option` or one "
                             f"`env`, and a rule of {', '.join(RULES)} (it has {dict(row)})")
        rules.append(rule)
    return RunningSpec(tuple(rules), tuple(running.get("env_prefixes", ())))


def at_path(table: Mapping[str, Any], path: str) -> Any:
    """table["a"]["b"] for "a.b", NOT_READ where a step is missing."""
    value: Any = table
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return NOT_READ
        value = value[key]
    return value


def flag_on(text: Any) -> bool:
    """A flag variable as vLLM's envs module parses it: "1" or "true", in any case, is on (vllm/envs.py)."""
    return str(text).strip().lower() in ("1", "true")


def _shown(value: Any) -> str:
    return "unset" if value is None else str(value)


def _same(asked: Any, runs: Any) -> bool:
    """Equal; names without regard to case (vLLM takes "triton_attn" for TRITON_ATTN), a flag only to a flag."""
    if isinstance(asked, str) and isinstance(runs, str):
        return asked.strip().lower() == runs.strip().lower()
    if isinstance(asked, bool) or isinstance(runs, bool):
        return isinstance(asked, bool) and isinstance(runs, bool) and asked == runs
    return bool(asked == runs)


# A rule: (asked, runs, the options asked, the option's or variable's name) -> (whether they agree, how the sentence
# names what was asked, how it names what runs)
Rule = Callable[[Any, Any, Mapping[str, Any], str], tuple[bool, str, str]]


def _equal(asked: Any, runs: Any, options: Mapping[str, Any], key: str) -> tuple[bool, str, str]:
    return _same(asked, runs), str(asked), _shown(runs)


def _graphs(asked: Any, runs: Any, options: Mapping[str, Any], key: str) -> tuple[bool, str, str]:
    eager = bool(asked)
    agree = runs == "NONE" if eager else runs not in ("NONE", None)
    return agree, f"{key}={eager}", _shown(runs) + (" (no CUDA/HIP graphs)" if runs == "NONE" else "")


def _kv_bytes(asked: Any, runs: Any, options: Mapping[str, Any], key: str) -> tuple[bool, str, str]:
    try:
        want = kv_model.kv_dtype_bytes(str(options.get("dtype")), str(asked))
    except kv_model.KVConfigError as exc:  # fail closed: a cache dtype the suite cannot size is no pass
        return False, f"{key}={asked} ({exc})", _shown(runs)
    return runs == want, f"{key}={asked}, {want} bytes an element", _shown(runs)


def _switch(asked: Any, runs: Any, options: Mapping[str, Any], key: str) -> tuple[bool, str, str]:
    on = flag_on(asked)
    return on == bool(runs), f"{key}={asked} ({'on' if on else 'off'})", f"{'on' if runs else 'off'} ({runs!r})"


RULES: dict[str, Rule] = {"equal": _equal, "graphs": _graphs, "kv_bytes": _kv_bytes, "switch": _switch}


@dataclass
class RunningConfigReport(Verdict):
    """Each asked field against what the engine runs; `runs` is the whole report (recorded)."""

    runs: dict[str, Any]
    judged: list[str] = field(default_factory=list)      # fields compared, agreeing or not
    problems: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        out = {"fields_judged": float(len(self.judged)), "fields_differing": float(len(self.problems))}
        for name in ("block_size", "kv_cache_bytes", "max_model_len", "tensor_parallel_size",
                     "max_cudagraph_capture_size", "enforce_eager"):
            value = self.runs.get(name)
            if isinstance(value, (bool, int, float)):
                out[name] = float(value)
        for name, value in sorted((self.runs.get("aiter") or {}).items()):
            out[f"aiter_{name}"] = float(bool(value))
        return out

    def failure_message(self) -> str:
        summary = ", ".join(f"{k}={self.runs[k]}" for k in ("attention_backend", "block_size", "kv_cache_dtype",
                                                             "moe_kernel", "cudagraph_mode") if k in self.runs)
        return ("the engine does not run the configuration it was asked for: " + "; ".join(self.problems)
                + (f" (it runs: {summary})" if summary else ""))


def asked_by(target: Any, kind: str) -> Callable[[str], str]:
    """Where the run asked an option or variable of its `kind` engines: the serving profile and row
    (`profile cpu:cpu`) where they name it, else the target's table of data/targets.toml, or the run's dtype."""
    profile = target.profile
    named = {**profile.engine_options(), **profile.engine_env()} if profile is not None else {}

    def source(key: str) -> str:
        top = key.split(".")[0]
        if top in named:
            return f"profile {profile.name}:{profile.backend.name}"
        if top == "dtype":
            return f"the run's dtype, {target.dtype}"
        return f"targets.toml [{target.name}.{'env' if top in target.env else kind}]"
    return source


def running_config_matches(runs: Mapping[str, Any], options: Mapping[str, Any], env: Mapping[str, str],
                           spec: RunningSpec, asked_by: Callable[[str], str]) -> RunningConfigReport:
    """`runs` (the engine's report) against the `options` and `env` it was started with. `asked_by(name)` says where
    an option or a variable was asked (`profile cpu:cpu`), for the sentence."""
    report = RunningConfigReport(dict(runs))
    unreadable = dict(runs.get("unreadable") or {})

    def judge(name: str, key: str, asked: Any, rule: str, runs_value: Any) -> None:
        report.judged.append(name)
        if runs_value is NOT_READ:
            why = next((unreadable[k] for k in (name, name.split(".")[0], "model") if k in unreadable),
                       "the engine's report has no such field")
            report.problems.append(f"{name}: asked {key}={asked} ({asked_by(key)}), the engine could not report it "
                                   f"({why})")
            return
        agree, asked_text, runs_text = RULES[rule](asked, runs_value, options, key)
        if not agree:
            report.problems.append(f"{name}: asked {asked_text} ({asked_by(key)}), runs {runs_text}")

    for row in spec.fields:
        key = row.option if row.option is not None else str(row.env)
        asked = at_path(options, key) if row.option is not None else env.get(key, NOT_READ)
        if asked is NOT_READ or asked is None:
            continue  # not asked for: what runs is recorded only
        judge(row.field, key, asked, row.rule, at_path(runs, row.field))
    seen = at_path(runs, "env")
    for name, asked in sorted(env.items()):
        if not spec.env_prefixes or not name.startswith(spec.env_prefixes):
            continue
        report.judged.append(f"env.{name}")
        if not isinstance(seen, Mapping):
            why = unreadable.get("env", "the engine's report has no environment")
            report.problems.append(f"env.{name}: asked {asked!r} ({asked_by(name)}), the engine could not report its "
                                   f"environment ({why})")
        elif seen.get(name) != str(asked):
            sees = "it unset" if seen.get(name) is None else repr(seen[name])
            report.problems.append(f"env.{name}: asked {asked!r} ({asked_by(name)}), the engine process sees {sees}")
        parsed = at_path(runs, f"envs.{name}")
        if parsed is not NOT_READ:  # vLLM reads it too: a flag as a bool, anything else as text
            judge(f"envs.{name}", name, asked, "switch" if isinstance(parsed, bool) else "equal", parsed)
    return report
