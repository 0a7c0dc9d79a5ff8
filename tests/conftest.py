"""Shared fixtures of the suite's own tests: the tiny model, the reference and a real vLLM-CPU engine."""

from __future__ import annotations

import pytest

from conformance.checkpoints.models import TinyModel, tiny_gpt_oss
from conformance.engines import forkserver
from conformance.engines.worker import EngineProcess
from conformance.verdicts import settings

pytest_plugins = ["tests.check_mutation"]  # each check's controls rerun against the check with its body gone


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start the forkserver with the CPU target's environment, as `conformance run` does, so that engine
    controls fork from it whichever test first needs a child process (its imports overlap collection)."""
    forkserver.start(settings.targets()["cpu"]["env"])


@pytest.fixture(scope="session")
def tiny() -> TinyModel:
    return tiny_gpt_oss()


@pytest.fixture(scope="session")
def tiny_prompts(tiny: TinyModel) -> tuple[list[list[int]], int]:
    return settings.tiny_prompts(tiny.spec.vocab_size)


@pytest.fixture(scope="session")
def reference(tiny: TinyModel):
    from conformance.reference import Reference

    return Reference(tiny.path)


def start_cpu_engine(model_dir: str, log_path, **overrides) -> EngineProcess:
    """A real vLLM-CPU engine configured exactly as the CPU target configures it."""
    table = settings.targets()
    options = dict(table["cpu"]["vllm"]) | {"dtype": "float32"} | overrides
    return EngineProcess("vllm", model_dir, options, dict(table["cpu"]["env"]), log_path,
                         start_timeout_s=float(table["timeouts"]["engine_start_s"]),
                         start_method=table["cpu"]["engine_start"])


@pytest.fixture(scope="session")
def cpu_engine(tiny: TinyModel, tmp_path_factory: pytest.TempPathFactory):
    proc = start_cpu_engine(str(tiny.path), tmp_path_factory.mktemp("engine") / "engine.log")
    yield proc
    proc.close()
