"""The conformance checks: one module per area, each check a plain pytest function with a tier."""

from typing import Any


def call_or_fail(engine: Any, method: str, *args: Any, timeout_s: float, **kwargs: Any) -> Any:
    """engine.call(method, ...), or the check fails with the engine's one sentence (CheckFailed, raised while
    handling the engine's error, which keeps its failure class: runrecord.classify)."""
    from conformance.engines.worker import EngineError
    from conformance.verdicts.verdict import fail

    try:
        return engine.call(method, *args, timeout_s=timeout_s, **kwargs)
    except EngineError as exc:
        fail(str(exc))
