#!/usr/bin/env bash
# Install a wheelhouse built by `nox -s wheelhouse` on a node that cannot download (docs/wheelhouse.md), then say
# what the node's stack now is. Usage: ci/offline-node.sh WHEELHOUSE_DIR [PYTHON]
#   WHEELHOUSE_DIR holds manifest.json and parts/ (or wheels/); PYTHON is the image's interpreter (default python3).
set -euo pipefail
where=${1:?usage: ci/offline-node.sh WHEELHOUSE_DIR [PYTHON]}
python=${2:-python3}
cd "$(dirname "$0")/.."
"$python" -m conformance.tooling.wheelhouse install "$where" --python "$python"
"$python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "vllm", "transformers", "triton", "openai-harmony", "quicktok-v1", "gpu-llm-conformance"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} absent")
PY
