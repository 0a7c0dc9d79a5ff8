"""Imported once by the engine forkserver (worker.py), so that each engine child forks with the
stacks already imported instead of importing them again (vLLM alone takes ~9 s on a 2-core host).
A stack that is not installed, or fails to import, is left for the child to report."""

import importlib

for _name in ("torch", "vllm", "vllm.entrypoints.llm", "transformers",
              "transformers.models.gpt_oss.modeling_gpt_oss"):
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001, S112 - the child that needs it raises it with context
        continue
