#!/usr/bin/env bash
# The main job on the embedded default: install, prepare SmolLM2-135M-Instruct, run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
exec .venv/bin/conveyor eval configs/quickstart-eval.yaml "$@"
