#!/usr/bin/env bash
# Verify a machine before it takes conformance jobs: device nodes and groups, kernel, driver, firmware,
# ROCm or CUDA, and the torch/vLLM build, judged against the bundled pin manifest of its platform
# (env_checks/pins/<platform>.toml) by `python -m env_checks --pins auto`.
#
#   ci/runner/verify-runner.sh                 judge this environment (inside the job's container, or a host
#                                              that has the stack installed)
#   ci/runner/verify-runner.sh IMAGE           judge IMAGE on this host: the same container, device options
#                                              and groups as the workflows' jobs (ROCm images)
#   ci/runner/verify-runner.sh --gpus IMAGE    the same for a CUDA image (docker --gpus all)
#
# Writes the full report (fingerprint, manifest, verdicts) to $VERIFY_OUT (default env-checks.json) and one
# line per verdict on stderr. Exit 0: every required pin holds; 1: a required pin is violated or could not be
# read (fail closed); 2: no manifest fits this platform or docker is missing.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${VERIFY_OUT:-env-checks.json}"
# The workflows' `container.options` for MI300X jobs (ci/workflows/*.yml); keep the two in step.
rocm_options=(--device=/dev/kfd --device=/dev/dri --group-add video --group-add render
              --ipc=host --shm-size 16g --security-opt seccomp=unconfined)

if [[ $# -eq 0 ]]; then
    cd "$repo"
    exec python3 -m env_checks --pins auto > "$out"
fi

if ! command -v docker > /dev/null; then
    echo "docker is not installed: the workflows run their jobs in containers (see ci/runner/README.md)." >&2
    exit 2
fi
options=("${rocm_options[@]}")
if [[ $1 == --gpus ]]; then
    options=(--gpus all --ipc=host --shm-size 16g)
    shift
fi
image="$1"
docker run --rm "${options[@]}" -v "$repo:/suite:ro" -w /suite "$image" \
    python3 -m env_checks --pins auto > "$out"
