"""Fixtures and helpers the checks' controls share (tests/controls/): the short prompt sets, the tiny model as
a check receives it, and the transformers engine the low-precision controls run on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def short_prompts(tiny_prompts) -> SimpleNamespace:
    return SimpleNamespace(prompts=[p[:40] for p in tiny_prompts[0][:3]], max_tokens=2)


def _hf(shared_engines, tiny, dtype: str, fault: str | None = None):
    """The transformers engine on the CPU in `dtype`, with `fault` planted (engines/faults.py), shared."""
    return shared_engines.get(tiny.path, "transformers", dtype=dtype, **({"planted_fault": fault} if fault else {}))


@pytest.fixture(scope="module")
def prompts(tiny_prompts):
    return SimpleNamespace(prompts=tiny_prompts[0], max_tokens=tiny_prompts[1])


@pytest.fixture(scope="module")
def model(reference):
    return SimpleNamespace(config=reference.cfg, num_params=1, name="tiny-gpt-oss", content_hash=None)
