"""Imported once by the engine forkserver (worker.py), so that each engine child forks with the
stacks already imported instead of importing them again (vLLM alone takes ~9 s on a 2-core host).
A stack that is not installed, or fails to import, is left for the child to report.

What it imported is then frozen out of the garbage collector (`gc.freeze`, as vLLM does after its own
start-up): the children fork with millions of objects that no collection needs to walk. vLLM runs full
collections while it loads a model, and on two cores they took 2.2 s of a 3.6 s engine start."""

import gc
import importlib
import os

from conformance.engines.forkserver import MORE_ENV, SKIP_ENV

_SKIP = {name for name in os.environ.get(SKIP_ENV, "").split(",") if name}
_MORE = [name for name in os.environ.get(MORE_ENV, "").split(",") if name]  # the target's forkserver_preload
for _name in ("torch", "vllm", "vllm.entrypoints.llm", "transformers",
              "transformers.models.gpt_oss.modeling_gpt_oss", *_MORE):
    if _name.split(".")[0] in _SKIP:  # forkserver.start(vllm=False)
        continue
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001, S112 - the child that needs it raises it with context
        continue
gc.collect()
gc.freeze()
