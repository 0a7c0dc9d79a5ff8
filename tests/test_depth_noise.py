"""The depth-noise measurement (conformance/tooling/depth_noise.py) that sets tolerances.toml `noise_ratio`: it runs
greedy parity's own body on a real engine and prints the engine's figures, the noise twin's and their ratios."""

from __future__ import annotations

import pytest

from conformance.tooling import depth_noise

pytestmark = pytest.mark.slow


def test_a_row_is_the_checks_verdict_with_the_engine_over_its_twin(capsys):
    assert depth_noise.main(["--layers", "8", "--seeds", "1", "--engine", "transformers", "--dtype", "float16"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    header, row = ([c.strip() for c in line.split("|")[1:-1]] for line in (lines[0], lines[-1]))
    cells = dict(zip(header, row))
    assert (cells["layers"], cells["seed"], cells["verdict"]) == ("8", "1", "pass")
    # 8 layers in fp16 exceed the fixed median limit (docs/verdicts.md): the twin ran, and the ratio is its own
    assert float(cells["ratio median"]) == pytest.approx(float(cells["engine median"]) / float(cells["twin median"]),
                                                         rel=0.02)
    assert 1.0 < float(cells["ratio median"]) < 3.0
