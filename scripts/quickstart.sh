#!/usr/bin/env bash
# The main job on the embedded default: install, prepare SmolLM2-135M-Instruct, RL-train it
# (supervised warm start, RL steps, held-out evaluation before and after).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
exec .venv/bin/conveyor train configs/quickstart.yaml "$@"
