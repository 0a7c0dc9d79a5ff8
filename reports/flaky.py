"""Checks that flip: across the counted runs of one lineage (oldest first), a check that passed, then failed, then
passed again (or failed, passed, failed) among its last `WINDOW` outcomes is **flaky**.

One change of outcome is a regression or a fix, and the newest run decides it. Two or more say that the outcome does
not follow the stack, so the newest run alone must not decide: the release decision (reports/verdict.py) reads a
lineage with a flaky check as not safe, naming each flip's runs and outcomes. Only the last `WINDOW` outcomes of a
check count, so a lineage whose check was broken and mended heals after that many steady runs. Passed and xpassed
count as passed; failed and errored as failed, except a measurement its check said was not like for like
(`shared_gpu`, `slower_host`, `unlike_pin`), which is no verdict either way; skips and known bugs are no outcome.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NOT_LIKE_FOR_LIKE = frozenset({"shared_gpu", "slower_host", "unlike_pin"})
MIN_FLIPS = 2  # changes of outcome that make a check flaky: one is a regression or a fix
WINDOW = 10  # the outcomes of a check, newest first, that its flips are counted over


@dataclass(frozen=True)
class Flaky:
    """A check that flipped on one lineage: `steps` are (run id, outcome) where its outcome changed, the first run
    of the sequence included, oldest first."""

    check_id: str
    tier: str
    steps: tuple[tuple[str, str], ...]

    @property
    def flips(self) -> int:
        return len(self.steps) - 1

    def describe(self) -> str:
        return " → ".join(f"{outcome} in {run_id}" for run_id, outcome in self.steps)


def _verdict(outcome: str, failure_class: str | None) -> str | None:
    if outcome in ("passed", "xpassed"):
        return "passed"
    if outcome in ("failed", "error") and failure_class not in NOT_LIKE_FOR_LIKE:
        return "failed"
    return None


def flaky_checks(run_ids: Iterable[str],
                 outcomes: Mapping[str, list[tuple[str, str, str, str | None]]]) -> list[Flaky]:
    """The flaky checks of one lineage: `run_ids` its counted runs, oldest first; `outcomes` run id -> (check id,
    tier, outcome, failure class) as `History.outcomes` returns them. Sorted by tier and check id."""
    history: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for run_id in run_ids:
        for check_id, tier, outcome, failure_class in outcomes.get(run_id, []):
            verdict = _verdict(outcome, failure_class)
            if verdict is not None:
                history.setdefault((tier, check_id), []).append((run_id, verdict))
    out = []
    for (tier, check_id), seen in sorted(history.items()):
        recent = seen[-WINDOW:]
        steps = [step for n, step in enumerate(recent) if n == 0 or step[1] != recent[n - 1][1]]
        if len(steps) - 1 >= MIN_FLIPS:
            out.append(Flaky(check_id, tier, tuple(steps)))
    return out
