#!/usr/bin/env bash
# Build ./.venv-inspect: inspect-ai + inspect-evals 0.26.0, for the tau2 parity check against
# inspect-evals' own scorers (`conveyor tasks parity tau2`, docs/benchmarks-bfcl-tau2.md).
# Idempotent. inspect-ai's dependency set is large and pins what our .venv does not need, so it
# gets a venv of its own; the check runs its side there (scripts/tau2_upstream_verdicts.py) and
# compares with ours in the main venv.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VENV=${CONVEYOR_INSPECT_VENV:-.venv-inspect}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip
$PIP install --quiet "inspect_ai==0.3.285" toml pyyaml
$PIP install --quiet --no-deps "inspect-evals==0.26.0"
