#!/usr/bin/env bash
# Build ./.venv-skyrl: SkyRL 0.4.0 for the SkyRL bridge check (docs/bridges-skyrl.md). Idempotent.
# SkyRL requires Python >= 3.12: the interpreter is $PYTHON312, else the first python3.13 or
# python3.12 that runs (PATH, then pyenv's versions). With none, this exits 3 and prints pip's
# refusal; the bridge check then uses the pinned wheel's source on this Python (the fallback).
# skyrl is installed with --no-deps plus what its validation runs on (numpy, loguru): its full
# dependency set needs CUDA torch, ray and flash-attn, and there is no CPU torch for 3.12 here.
# The check runs this venv's Python on conveyor/bridges/skyrl/validation.py by path, so Conveyor
# itself is not installed in it.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${CONVEYOR_SKYRL_VENV:-.venv-skyrl}
SKYRL="skyrl==0.4.0"

runs_312() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

PY=""
for candidate in ${PYTHON312:-} python3.13 python3.12 \
  "$HOME"/.pyenv/versions/3.13*/bin/python3 "$HOME"/.pyenv/versions/3.12*/bin/python3; do
  if [ -n "$candidate" ] && runs_312 "$candidate"; then PY=$candidate; break; fi
done

if [ -z "$PY" ]; then
  # pip's own words for why skyrl does not install on this Python (download: no venv needed).
  OLD=python3; [ -x .venv/bin/python ] && OLD=.venv/bin/python
  echo "no Python >= 3.12 found (set PYTHON312=/path/to/python3.12); pip on $($OLD --version) says:" >&2
  TMP=$(mktemp -d)
  $OLD -m pip download --no-deps -d "$TMP" "$SKYRL" 2>&1 | grep -E "^ERROR" >&2 || true
  rm -rf "$TMP"
  exit 3
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip
$PIP install --quiet --no-deps "$SKYRL"
$PIP install --quiet "numpy>=2" loguru
echo "$VENV: $("$VENV/bin/python" --version), skyrl $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("skyrl"))')"
