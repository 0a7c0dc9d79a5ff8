"""The depth-noise measurement (conformance/run/depth_noise.py) that sets tolerances.toml `noise_ratio`: it runs
greedy parity's own body on a real engine and prints the engine's figures, the noise twin's and their ratios. Its
sweep of 2026-12-04 (fixtures/recorded/depth-noise/, docs/verdicts.md "Greedy parity at depth") is judged again
here by today's limits: no healthy model fails them, and the planted faults still do."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.run import depth_noise
from conformance.verdicts.limits import limits_for

SWEEP = Path(__file__).resolve().parent.parent / "fixtures" / "recorded" / "depth-noise"
FIXED = {"median": "median", "stratum": "stratum_median", "p99": "p99", "max": "max_abs"}


def table(lines: list[str]) -> list[dict[str, str]]:
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in lines if line.startswith("| ")]
    return [dict(zip(rows[0], r)) for r in rows[1:]]


def exceeds(row: dict[str, str], dtype: str) -> list[str]:
    """The statistics of a recorded row over today's limits, widened as the check widens them."""
    tol = limits_for(dtype).logprobs[0]
    over = []
    for stat, fixed in FIXED.items():
        limit, engine, twin = getattr(tol, fixed), float(row[f"engine {stat}"]), row[f"twin {stat}"]
        widened = max(limit, tol.noise_ratio * float(twin)) if twin != "within fixed limits" else limit
        if engine > widened:
            over.append(stat)
    return over


@pytest.mark.parametrize(("name", "dtype"), [("vllm-bf16", "bfloat16"), ("hf-fp16", "float16")])
def test_no_healthy_model_of_the_sweep_fails_todays_limits(name, dtype):
    rows = table((SWEEP / f"{name}.md").read_text().splitlines())
    assert len(rows) == 40 and {r["layers"] for r in rows} == {"8", "16"}
    assert [r["seed"] for r in rows if exceeds(r, dtype)] == []


@pytest.mark.parametrize(("name", "dtype", "caught"), [("vllm-bf16-sinks", "bfloat16", 18),
                                                       ("hf-fp16-sinks", "float16", 20),
                                                       ("vllm-bf16-rope", "bfloat16", 9)])
def test_the_sweeps_faults_still_fail_todays_limits(name, dtype, caught):
    rows = table((SWEEP / f"{name}.md").read_text().splitlines())
    assert sum(bool(exceeds(r, dtype)) for r in rows) >= caught


@pytest.mark.slow
def test_a_row_is_the_checks_verdict_with_the_engine_over_its_twin(capsys):
    assert depth_noise.main(["--layers", "8", "--seeds", "1", "--engine", "transformers", "--dtype", "float16"]) == 0
    rows = table(capsys.readouterr().out.splitlines())
    assert (rows[-1]["layers"], rows[-1]["seed"], rows[-1]["verdict"]) == ("8", "1", "pass")
    assert exceeds(rows[-1], "float16") == []
    # 8 layers in fp16 exceed the fixed median limit (docs/verdicts.md): the twin ran, and the ratio is its own
    cells = rows[-1]
    assert float(cells["ratio median"]) == pytest.approx(float(cells["engine median"]) / float(cells["twin median"]),
                                                         rel=0.02)
    assert 1.0 < float(cells["ratio median"]) < 3.0
