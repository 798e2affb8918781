#!/usr/bin/env bash
# Build ./.venv-verl: VeRL 0.9.1 next to Conveyor, for the VeRL bridge (docs/bridges-verl.md).
# Idempotent. VeRL pins transformers < 5.11 and tensordict <= 0.10, which our .venv does not
# allow, hence a venv of its own. verl is installed with --no-deps plus only what its agent-loop
# and dataset modules import: its full dependency set (ray[default], wandb, tensorboard, peft, ...)
# is for training on GPUs, which this venv is not for (the bridge check and the dataset test).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VENV=${CONVEYOR_VERL_VENV:-.venv-verl}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip

# The CPU torch wheel first, so nothing pulls a multi-GB CUDA build.
$PIP install --quiet "torch==2.13.0"
$PIP install --quiet --no-deps "verl==0.9.1"
$PIP install --quiet \
  "transformers>=5.5.3,<5.11,!=5.6.0" "tensordict>=0.8,<=0.10,!=0.9.0" \
  "numpy>=2" "ray>=2.41" hydra-core omegaconf pillow pydantic pyarrow pandas datasets \
  codetiming dill packaging cachetools fastapi uvicorn
# Conveyor itself, without its heavy extras (vllm, the trainer's extras): the bridge's conversion
# code and the check need only its light core.
$PIP install --quiet --no-deps -e .
$PIP install --quiet pyyaml typer rich httpx bm25s
