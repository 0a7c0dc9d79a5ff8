"""The options of a run, declared once: `conformance run` (argparse) and the pytest plugin (`addoption`) are both
built from `OPTIONS` and `target_flags()`, and the CLI hands each value on to pytest through the same table.

Standard library only at import, beside the data it reads (the CLI imports it before pytest)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from conformance.run import run_target, tiers

# a bare `--server`: the openai SDK's variable names the server (conformance.engines.openai_api.FROM_ENV)
SERVER_FROM_ENV = "$OPENAI_BASE_URL"


@dataclass(frozen=True)
class Option:
    """One option: its flag, its help, and what argparse and pytest's addoption both take besides (default,
    choices, nargs, const, action, metavar, dest)."""

    flag: str
    help: str
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def dest(self) -> str:
        return str(self.settings.get("dest", self.flag.removeprefix("--").replace("-", "_")))

    def add_to(self, add: Callable[..., Any]) -> None:
        """Declare it through `add` (argparse's add_argument or pytest's addoption)."""
        add(self.flag, help=self.help, **self.settings)

    def relayed(self, value: Any) -> list[str]:
        """The pytest arguments that hand `value` on: one token, so a value starting with '-' (or a bare --server)
        stays this option's; none for an option left unset."""
        if value is None or value is False:
            return []
        if value is True:
            return [self.flag]
        if isinstance(value, list):
            return [a for each in value for a in (self.flag, str(each))]
        return [f"{self.flag}={value}"]


def _option(flag: str, help: str, **settings: Any) -> Option:
    return Option(flag, help, MappingProxyType(settings))


OPTIONS: tuple[Option, ...] = (
    _option("--tier", f"tier to run ({', '.join(tiers.TIERS)}; repeatable or comma-separated; default: "
                      f"{', '.join(tiers.DEFAULT_TIERS)} through `conformance run`, every tier through pytest); "
                      "combines with -m and -k", action="append", metavar="TIER"),
    _option("--model", "local gpt-oss checkpoint directory (default: the tiny generated one)"),
    _option("--engine", "engine under test (default per target; data/engines.toml)",
            choices=list(run_target.engine_names())),
    _option("--dtype", "float32 | bfloat16 | float16 (default per target; data/targets.toml)"),
    _option("--combo", "matrix combination id (ci/matrix.toml) recorded in the run"),
    _option("--server", "URL of a running OpenAI-compatible server to test instead of starting one, with or without "
                        "/v1 (alone: $OPENAI_BASE_URL; key: $CONFORMANCE_SERVER_API_KEY or $OPENAI_API_KEY)",
            nargs="?", const=SERVER_FROM_ENV),
    _option("--tokenizer-vocab", "o200k_base.tiktoken file or folder (offline vocab; nothing is downloaded)"),
    _option("--eval-data", "folder of local eval datasets (gsm8k, GPQA, AIME) for the P3 accuracy checks"),
    _option("--history-db", "history store for the serving drift (default reports/history.sqlite); the pinned "
                            "baselines are baselines.json beside it, or $CONFORMANCE_BASELINES"),
    _option("--profile", "serving profile NAME[:BACKEND] from data/profiles.toml (default: the production profile of "
                         "the detected SKU and model; `cpu` on the CPU default); NAME:all (`conformance run` only) "
                         "runs once per backend row, the rows after the first the engine-level checks"),
    _option("--health-policy", "machine-health policy TOML (default: the suite's data/health.toml)"),
    _option("--fresh-reference", "compute every fp64 reference result again: by default a result already computed "
                                 "for the same checkpoint bytes, token ids, options and reference source is read "
                                 "from the cache", action="store_true"),
    _option("--reference-pack", "fp64 reference results keyed by model, prompt set and reference version: read where "
                                "the pack exists, written at the run's end, so another node skips computing them; a "
                                "FILE made for another prompt set or reference version is refused before anything "
                                "runs, one made for another model in the check that first needs it",
            metavar="FILE|DIR"),
    _option("--compile-cache", "a fleet's shared compiler caches (vLLM's torch.compile artifacts, Inductor's and "
                               "Triton's kernels) in DIR/vllm, DIR/inductor, DIR/triton: a node that finds them filled "
                               "loads the kernels the first node built; the run records whether it did", metavar="DIR"),
    _option("--planted-fault", "negative controls only: plant this fault of conformance/engines/faults.py in the "
                               "engine under test; the run is recorded as a control, never as a platform result"),
    _option("--reports-dir", "where runs are written (default reports/runs)", default="reports/runs"),
)


def target_flags() -> tuple[Option, ...]:
    """`--cpu`, `--cuda`, `--rocm`: one flag per target of data/targets.toml, each the same as `--target NAME`."""
    return tuple(_option(f"--{name}", f"assert the {name} stack and test it (same as --target {name})",
                         dest="target", action="store_const", const=name) for name in run_target.names())
